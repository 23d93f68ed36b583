"""Everything issue 8 asks of the SGLang engine on a GPU, in one command, stage by stage.

    python bench/sglang_check.py --out $OUT --deadline-s 480

Stages, in order; each runs in its own process (SGLang keeps process-wide state) with its log kept, a failure
is recorded with its traceback and the next stage still runs, and a stage starts only while its minimum time
is left before --deadline-s:
  env       versions (python, torch, sglang, sgl_kernel, flashinfer, transformers) and the GPU.
  api       a tiny random-weight pair (safetensors, so both engines load the same weights) under an R-Stitch
            policy (each model hands over above / below its own median normalized entropy on the prompts, so
            hops go both ways about half the time; one shared threshold kept 95 % of tokens on the large
            model in the first GPU runs), served by `tokenrouter serve` with both models on the embedded engine, then with both on
            SGLang (`engine: "sglang"`); the same greedy requests through the `openai` client (completions on
            token-id prompts with `return_routing_trace`, one chat request); the agreement of the routing
            traces and texts; then streamed requests aborted mid-run (client disconnect) and every model's KV
            pages checked free again through /metrics.
  perf      Qwen3-0.6B + Qwen3-8B shapes (dummy weights), bernoulli p = 0.1, N = 4 and 8 (2N requests of
            --output-len tokens, after a warm-up): TokenRouter on the embedded engine, TokenRouter on SGLang,
            and SGLang's own server on the 8B alone (bench/sglang_only.py); the same load (loadgen/bench.py).
  decode    decode step at bs 1, ctx 512, of both shapes: the embedded engine and SGLangEngine, same harness.
  contract  pytest tests/engine_sglang on the GPU (the contract suite's `sglang` and `embedded-cuda`
            parameters, the source-level API test).
Writes into --out: summary.json and summary.md (rewritten after every stage, so a command killed at its limit
still returns what finished) and logs.tar.gz (every stage's log). Exits 3 without CUDA or SGLang.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # its siblings (served, matrix, sglang_only)

from served import Server  # noqa: E402
from served import prom_values as parse_metrics  # noqa: E402  (Prometheus text -> {'name{labels}': value})

# the tiny pair has the attention shapes of Qwen3-0.6B / -8B (heads, KV heads, head dim): SGLang's Triton
# attention kernels are specialized on them, so the api stage's compiles serve the perf stage's models too
SMALL = dict(hidden=256, intermediate=512, layers=2, heads=16, kv_heads=8, head_dim=128)
LARGE = dict(hidden=512, intermediate=1024, layers=4, heads=32, kv_heads=8, head_dim=128, tie=False)
API_POLICY = """policy check "R-Stitch on the tiny pair, engine {engine}"
param up: float = {up}
param down: float = {down}
model slm = "{slm}" {{ gpu: 0, batch: 2, mem: 0.02, max_len: 2048{opt} }}
model llm = "{llm}" {{ gpu: 0, batch: 1, mem: 0.02, max_len: 2048{opt} }}
serve {{ concurrency: 8, max_delay_ms: 5 }}
entry slm
route slm {{
  when norm_entropy > up -> llm drop
}}
route llm {{
  when norm_entropy <= down -> slm
}}
"""
# seconds a stage needs to be worth starting, and the most it may take (a hang must not eat the later stages)
MIN_S = {"env": 5, "api": 100, "perf": 150, "contract": 60, "decode": 60}
MAX_S = {"env": 60, "api": 240, "perf": 300, "contract": 150, "decode": 150}
ORDER = ("env", "api", "perf", "contract", "decode")
PGIDS = "pgids.txt"  # process groups a stage started (servers), killed by the orchestrator if left running


# ---- pure helpers (tested on CPU) ------------------------------------------------------------------------


def agreement(embedded: list[dict], sglang: list[dict]) -> dict:
    """Per request, the positions where both engines' routing traces name the same model, the first position
    where they differ, and whether the texts are equal. Inputs: [{"trace": [...], "text": str}]."""
    per = []
    for a, b in zip(embedded, sglang, strict=True):
        ta, tb = a["trace"], b["trace"]
        n = min(len(ta), len(tb))
        same = [ta[i] == tb[i] for i in range(n)]
        first = next((i for i, s in enumerate(same) if not s), None)
        common = os.path.commonprefix([a["text"], b["text"]])
        per.append({
            "tokens": n, "trace_agree": sum(same) / max(n, 1), "first_trace_divergence": first,
            "text_equal": a["text"] == b["text"],
            "text_common_prefix": len(common) / max(len(a["text"]), len(b["text"]), 1),
            "llm_share": [ta.count("llm") / max(len(ta), 1), tb.count("llm") / max(len(tb), 1)],
        })  # fmt: skip
    k = max(len(per), 1)
    return {
        "requests": len(per),
        "trace_agree_mean": sum(p["trace_agree"] for p in per) / k,
        "positions_before_first_divergence": sum(
            (p["first_trace_divergence"] if p["first_trace_divergence"] is not None else p["tokens"])
            for p in per
        )
        / max(sum(p["tokens"] for p in per), 1),
        "texts_equal": sum(p["text_equal"] for p in per),
        "llm_share_embedded": sum(p["llm_share"][0] for p in per) / k,
        "llm_share_sglang": sum(p["llm_share"][1] for p in per) / k,
        "per_request": per,
    }


def kv_pages(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """{model: {"total": …, "free": …}} from tokenrouter_kv_pages_{total,free}{model="…"}."""
    out: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        if m := re.fullmatch(r'tokenrouter_kv_pages_(total|free)\{model="([^"]+)"\}', key):
            out.setdefault(m.group(2), {})[m.group(1)] = value
    return out


def perf_ratios(runs: list[dict]) -> list[dict]:
    """Per N: each TokenRouter run's throughput over sglang-only's."""
    base = {r["n"]: r["tok_s"] for r in runs if r["mode"] == "sglang-only" and r.get("tok_s")}
    return [
        {"mode": r["mode"], "n": r["n"], "ratio_vs_sglang_only": r["tok_s"] / base[r["n"]]}
        for r in runs
        if r["mode"] != "sglang-only" and r.get("tok_s") and r["n"] in base
    ]


def summary_markdown(summary: dict) -> str:
    lines = [f"# bench/sglang_check.py — {summary.get('started', '')}", "", "| stage | status | seconds |",
             "| --- | --- | --- |"]  # fmt: skip
    for name, st in summary["stages"].items():
        lines.append(f"| {name} | {st.get('status')} | {st.get('seconds', 0):.0f} |")
    stages = summary["stages"]
    api = stages.get("api", {}).get("result", {})
    if ag := api.get("agreement"):
        lines += ["", "## api (both models on SGLang vs both embedded)",
                  f"trace agreement {ag['trace_agree_mean']:.3f}; positions before the first divergence "
                  f"{ag['positions_before_first_divergence']:.3f}; texts equal {ag['texts_equal']}/{ag['requests']}; "
                  f"llm share embedded {ag['llm_share_embedded']:.2f}, sglang {ag['llm_share_sglang']:.2f}"]  # fmt: skip
    for engine in ("embedded", "sglang"):
        if ab := api.get(f"abort_{engine}"):
            lines.append(f"abort ({engine}): freed={ab.get('freed')} during={ab.get('during')} "
                         f"after={ab.get('after')}")  # fmt: skip
    perf = stages.get("perf", {}).get("result", {})
    if perf.get("runs"):
        lines += ["", "## perf (0.6B + 8B shapes, dummy weights, bernoulli p = 0.1)", "",
                  "| mode | N | tok/s | TTFT p50 ms | TPOT p50 ms | tokens per model | server start s |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in perf["runs"]:
            lines.append(f"| {r['mode']} | {r['n']} | {r.get('tok_s', 0):.1f} | {r.get('ttft_p50_ms', 0):.1f} | "
                         f"{r.get('tpot_p50_ms', 0):.2f} | {r.get('tokens_per_model')} | {r.get('startup_s', 0):.0f} |")  # fmt: skip
        for q in perf.get("ratios", []):
            lines.append(f"- {q['mode']} / sglang-only at N = {q['n']}: **{q['ratio_vs_sglang_only']:.2f}×**")
    dec = stages.get("decode", {}).get("result", {})
    if dec.get("steps"):
        lines += [
            "",
            "## decode step, bs 1, ctx 512 (ms)",
            "",
            "| shape | engine | ms |",
            "| --- | --- | --- |",
        ]
        for d in dec["steps"]:
            lines.append(f"| {d['shape']} | {d['engine']} | {d.get('ms', float('nan')):.3f} |")
    con = stages.get("contract", {}).get("result", {})
    if con.get("tail"):
        lines += ["", "## contract", "```", con["tail"], "```"]
    for name, st in stages.items():
        if st.get("error"):
            lines += ["", f"## {name}: error", "```", st["error"][-3000:], "```"]
    return "\n".join(lines) + "\n"


# ---- stage plumbing ------------------------------------------------------------------------------------------


class Stage:
    """What a stage process has: its work folder, its deadline, and a result dict written after every step."""

    def __init__(self, name: str, work: Path, result: Path, deadline: float) -> None:
        self.name, self.work, self.result_path, self.deadline = name, work, result, deadline
        self.res: dict = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.result_path.write_text(json.dumps(self.res, indent=1, default=str))

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {self.name}: {text}", flush=True)

    def track(self, pgid: int) -> None:
        with open(self.work / PGIDS, "a") as f:
            f.write(f"{pgid}\n")


def _versions() -> dict:
    import torch

    out = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("sglang", "sgl_kernel", "flashinfer", "transformers", "triton", "tokenizers", "openai"):
        try:
            mod = __import__(name)
            out[name] = getattr(mod, "__version__", "?")
        except Exception as e:  # noqa: BLE001 - a version report
            out[name] = f"import failed: {type(e).__name__}: {e}"
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        free, total = torch.cuda.mem_get_info(0)
        out["gpu_mem_free_gib"], out["gpu_mem_total_gib"] = free / 2**30, total / 2**30
    return out


def stage_env(st: Stage) -> None:
    st.res["versions"] = _versions()
    st.save()
    st.say(json.dumps(st.res["versions"]))


def start_server(st: Stage, plan: Path, log: Path, timeout: float) -> Server:
    """`tokenrouter serve PLAN` in its own session (bench/served.py); its process group is recorded before it is
    waited for, so the orchestrator can end it if this stage is cut short."""
    args = ["--startup-timeout", str(int(timeout))]
    return Server(plan, args, log, timeout=timeout + 30, on_start=st.track)


def _metrics(url: str) -> dict[str, float]:
    import httpx

    return parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)


def median_norm_entropy(slm: Path, prompts: list[list[int]]) -> float:

    from tokenrouter.runtime.engine.base import StepInput
    from tokenrouter.runtime.engine.embedded import load_engine

    # on the CPU in float32: no kernel compilation before the servers start (the tiny model takes a second)
    eng = load_engine(slm, device="cpu", dtype="float32", max_tokens=4096)
    logits = eng.forward([StepInput(f"p{i}", p) for i, p in enumerate(prompts)]).logits.float()
    ent = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1) / math.log(logits.shape[-1])
    del eng, logits
    return float(ent.median())


def _api_requests(url: str, prompts: list[list[int]], max_tokens: int) -> dict:
    """The same greedy requests through the openai client, concurrently (so the subservers batch them)."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
    model = client.models.list().data[0].id

    def one(p: list[int]) -> dict:
        r = client.completions.create(model=model, prompt=p, max_tokens=max_tokens, temperature=0,
                                      extra_body={"ignore_eos": True, "return_routing_trace": True})  # fmt: skip
        choice = r.model_dump()["choices"][0]
        return {"text": choice["text"], "trace": choice["routing"]["trace"], "routing": {
            k: v for k, v in choice["routing"].items() if k != "trace"}, "usage": r.usage.model_dump()}  # fmt: skip

    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(one, prompts))
    out = {"model": model, "results": results}
    try:
        chat = client.chat.completions.create(model=model, max_tokens=16, temperature=0,
                                              messages=[{"role": "user", "content": "def add(a, b):"}])  # fmt: skip
        out["chat"] = {"text": chat.choices[0].message.content, "finish": chat.choices[0].finish_reason,
                       "usage": chat.usage.model_dump()}  # fmt: skip
    except Exception as e:  # noqa: BLE001 - recorded, the completions above are the check
        out["chat"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _abort_check(url: str, prompts: list[list[int]]) -> dict:
    """Stream requests, drop the connections after a few tokens, and wait until every model's KV is free."""
    import httpx

    before = kv_pages(_metrics(url))
    fin = "tokenrouter_requests_finished_total"
    aborts0 = _metrics(url).get(f'{fin}{{reason="abort"}}', 0.0)
    body = {"prompt": None, "max_tokens": 1990, "temperature": 0, "ignore_eos": True, "stream": True}
    clients, streams = [], []
    for p in prompts:
        c = httpx.Client(timeout=60)
        s = c.stream("POST", f"{url}/v1/completions", json=body | {"prompt": p})
        r = s.__enter__()
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data:"):
                got += 1
                if got >= 5:
                    break
        clients.append(c)
        streams.append(s)
    time.sleep(0.7)  # a stats report (every 0.5 s) while they run
    during = kv_pages(_metrics(url))
    for s, c in zip(streams, clients, strict=True):
        s.__exit__(None, None, None)
        c.close()
    after, deadline = {}, time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(0.5)
        m = _metrics(url)
        after = kv_pages(m)
        if m.get("tokenrouter_requests_active", 1) == 0 and all(
            v.get("free") == v.get("total") for v in after.values()
        ):
            break
    aborts = _metrics(url).get(f'{fin}{{reason="abort"}}', 0.0) - aborts0
    freed = bool(after) and all(v.get("free") == v.get("total") for v in after.values())
    held = any(during[m].get("free", 0) < during[m].get("total", 0) for m in during)
    return {"before": before, "during": during, "after": after, "aborts": aborts, "held_during": held,
            "freed": freed}  # fmt: skip


def stage_api(st: Stage) -> None:
    from tokenrouter.runtime.engine.make_model import make_model, shape_for

    out = st.work / "api"
    out.mkdir(parents=True, exist_ok=True)
    slm, llm = out / "slm", out / "llm"
    make_model(slm, shape_for("tiny", **SMALL), seed=1, weights=True, force=True)
    make_model(llm, shape_for("tiny", **LARGE), seed=2, weights=True, force=True)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(8, 40))] for _ in range(8)]
    up, down = median_norm_entropy(slm, prompts), median_norm_entropy(llm, prompts)
    st.res.update(thresholds={"up": up, "down": down}, prompts=len(prompts), max_tokens=48)
    st.save()
    answers = {}

    def start(engine: str) -> Server:
        policy = out / f"check-{engine}.tr"
        opt = ', engine: "sglang"' if engine == "sglang" else ""
        policy.write_text(
            API_POLICY.format(engine=engine, up=repr(up), down=repr(down), slm=slm, llm=llm, opt=opt)
        )
        srv = start_server(st, policy, out / f"serve-{engine}.stderr", timeout=max(30.0, st.left() - 40))
        st.say(f"serving both models on {engine} after {srv.startup_s:.0f} s")
        return srv

    def exercise(srv: Server, engine: str) -> None:
        st.res[f"startup_s_{engine}"] = srv.startup_s
        answers[engine] = _api_requests(srv.url, prompts, 48)
        st.res[f"answers_{engine}"] = answers[engine]
        st.save()
        st.res[f"abort_{engine}"] = _abort_check(srv.url, prompts[:4])
        st.res[f"metrics_{engine}"] = {k: v for k, v in _metrics(srv.url).items()
                                       if "kv_pages" in k or "steps_total" in k or "hops_total" in k}  # fmt: skip
        st.save()
        st.say(f"abort on {engine}: {st.res[f'abort_{engine}']}")

    # SGLang's first start compiles kernels (~90 s): start it first, and exercise the embedded one meanwhile
    pending: dict = {}

    def start_sglang() -> None:
        try:
            pending["srv"] = start("sglang")
        except BaseException as e:  # noqa: BLE001 - re-raised in the stage's thread
            pending["error"] = e

    starter = threading.Thread(target=start_sglang, name="start-sglang", daemon=True)
    starter.start()
    try:
        srv = start("embedded")
        try:
            exercise(srv, "embedded")
        finally:
            srv.stop()
        starter.join(max(1.0, st.left() - 20))
        if "error" in pending:
            raise pending["error"]
        if "srv" not in pending:
            raise RuntimeError("the SGLang deployment did not start in time")
        exercise(pending["srv"], "sglang")
    finally:
        if "srv" in pending:
            pending["srv"].stop()
    st.res["agreement"] = agreement(answers["embedded"]["results"], answers["sglang"]["results"])
    st.save()
    ag = st.res["agreement"]
    st.say(f"trace agreement {ag['trace_agree_mean']:.3f}, texts equal {ag['texts_equal']}/{ag['requests']}")


def _load_report(url: str, n: int, num: int, length: int) -> dict:
    import asyncio

    from tokenrouter.loadgen.bench import LoadSpec, run_load

    spec = LoadSpec(url=url, concurrency=n, num_prompts=num, output_len=length, progress=False)
    return asyncio.run(run_load(spec))


def _run_record(mode: str, n: int, report: dict, startup_s: float) -> dict:
    return {
        "mode": mode, "n": n, "tok_s": report["decode_throughput_tok_s"], "startup_s": startup_s,
        "ttft_p50_ms": report["ttft_ms"]["p50"], "tpot_p50_ms": report["tpot_ms"]["p50"],
        "tokens_per_model": report.get("tokens_per_model"), "failed": report.get("failed"), "report": report,
    }  # fmt: skip


def _perf_tokenrouter(
    st: Stage, mode: str, plan: Path, raw: Path, output_len: int, ns: tuple[int, ...]
) -> None:
    if st.left() < 60:
        st.res.setdefault("skipped", []).append(mode)
        return
    try:
        srv = start_server(
            st, plan, raw / f"serve-{mode}.stderr", timeout=max(30.0, min(160.0, st.left() - 40))
        )
    except Exception as e:  # noqa: BLE001 - the next mode still runs
        st.res.setdefault("errors", {})[mode] = traceback.format_exc()
        st.say(f"{mode} failed to start: {e}")
        st.save()
        return
    st.say(f"{mode} serving after {srv.startup_s:.0f} s")
    try:
        for n in ns:
            _load_report(srv.url, n, n, 16)  # warm-up: kernels, graphs
            report = _load_report(srv.url, n, 2 * n, output_len)
            rec = _run_record(mode, n, report, srv.startup_s)
            rec["metrics"] = {k: v for k, v in _metrics(srv.url).items()
                              if "step_latency_seconds_mean" in k or "steps_total" in k or "hops_total" in k}  # fmt: skip
            st.res["runs"].append(rec)
            st.save()
            st.say(
                f"{mode} N={n}: {rec['tok_s']:.1f} tok/s, {rec['tokens_per_model']}, failed {rec['failed']}"
            )
    except Exception:  # noqa: BLE001
        st.res.setdefault("errors", {})[mode] = traceback.format_exc()
        st.save()
    finally:
        srv.stop()


def _perf_sglang_only(st: Stage, folder: str, output_len: int, ns: tuple[int, ...]) -> None:
    if st.left() < 60:
        st.res.setdefault("skipped", []).append("sglang-only")
        return
    import sglang_only

    args = sglang_only.parse_args(
        ["--model-path", folder, "--load-format", "dummy", "--output-len", str(output_len),
         "--rounds", "2", "--warmup-len", "16", "--server-arg=--cuda-graph-max-bs-decode",
         "--server-arg=16", "--start-timeout", str(max(30.0, min(160.0, st.left() - 40)))]
        + [f"-c{n}" for n in ns]
    )  # fmt: skip
    try:
        reports, startup_s = sglang_only.run(args, on_start=st.track)
        for rep in reports:
            rec = _run_record("sglang-only", rep["spec"]["concurrency"], rep, startup_s)
            st.res["runs"].append(rec)
            st.say(f"sglang-only N={rec['n']}: {rec['tok_s']:.1f} tok/s, failed {rec['failed']}")
    except Exception:  # noqa: BLE001
        st.res.setdefault("errors", {})["sglang-only"] = traceback.format_exc()
    st.save()


PERF_MODES = ("tr-embedded", "sglang-only", "tr-sglang")
DECODE_CASES = ("qwen3-0.6b:embedded", "qwen3-0.6b:sglang", "qwen3-8b:embedded", "qwen3-8b:sglang")


def stage_perf(st: Stage, output_len: int, ns: tuple[int, ...], modes: tuple[str, ...] = PERF_MODES) -> None:
    import matrix

    from tokenrouter.compiler.plan import read_plan, write_plan

    raw = st.work / "perf"
    raw.mkdir(parents=True, exist_ok=True)
    s = matrix.Settings(out=raw, work=raw, device=None)
    plan_e = matrix.base_plan(s, "0.6b+8b", "bern0.1", raw)
    plan = read_plan(plan_e)
    for spec in plan["models"].values():
        spec["engine"] = "sglang"
    plan_s = raw / "0.6b+8b-bern0.1-sglang.plan"
    write_plan(plan, plan_s)
    st.res.update(runs=[], output_len=output_len, requests_per_run="2N", plans=[str(plan_e), str(plan_s)])
    st.save()
    # the two references first, so that a TokenRouter-on-SGLang start that hangs cannot cost them
    if "tr-embedded" in modes:
        _perf_tokenrouter(st, "tr-embedded", plan_e, raw, output_len, ns)
    if "sglang-only" in modes:
        _perf_sglang_only(st, matrix.model_folder(s, "qwen3-8b"), output_len, ns)
    if "tr-sglang" in modes:
        _perf_tokenrouter(st, "tr-sglang", plan_s, raw, output_len, ns)
    st.res["ratios"] = perf_ratios(st.res["runs"])
    st.save()


def decode_step_ms(engine, bs: int = 1, ctx: int = 512, steps: int = 100, reps: int = 3) -> float:
    """Back-to-back decode steps of `bs` rows holding `ctx` tokens, wall clock per step (best of `reps`)."""
    import torch

    from tokenrouter.runtime.engine.base import StepInput

    rng = random.Random(0)
    rids = [f"d{i}" for i in range(bs)]
    engine.forward([StepInput(r, [rng.randrange(3, 500) for _ in range(ctx)]) for r in rids])
    step = [StepInput(r, [7]) for r in rids]
    for _ in range(10):
        engine.forward(step)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.forward(step)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / steps * 1e3)
    for r in rids:
        engine.release(r)
    return best


def decode_one(engine_kind: str, folder: str) -> dict:
    """One engine on one model folder (dummy weights), in this process."""
    import torch

    t0 = time.monotonic()
    if engine_kind == "sglang":
        from tokenrouter.runtime.engine.sglang_engine import load_sglang_engine

        eng = load_sglang_engine(folder, device="cuda:0", load="dummy", max_tokens=16384, max_batch=8,
                                 max_len=4096)  # fmt: skip
    else:
        from tokenrouter.runtime.engine.embedded import load_engine

        eng = load_engine(folder, device="cuda", dtype="bfloat16", load="dummy", max_tokens=16384, max_batch=8,
                          max_len=4096)  # fmt: skip
    load_s = time.monotonic() - t0
    ms = decode_step_ms(eng)
    out = {"ms": ms, "load_s": load_s, "graph_steps": eng.stats().get("graph_steps")}
    del eng
    torch.cuda.empty_cache()
    return out


def stage_decode(st: Stage, cases: tuple[str, ...] = DECODE_CASES) -> None:
    import matrix

    s = matrix.Settings(out=st.work / "perf", work=st.work / "perf", device=None)
    st.res["steps"] = []
    for case in cases:  # one process each: SGLang keeps process-wide state
        shape, kind = case.split(":")
        folder = matrix.model_folder(s, shape)
        if st.left() < 40:
            st.res["steps"].append({"shape": shape, "engine": kind, "error": "skipped: out of time"})
            continue
        cmd = [sys.executable, __file__, "--decode-one", kind, folder]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=st.left() - 5)
        print(proc.stderr[-4000:], flush=True)
        rec = {"shape": shape, "engine": kind}
        try:
            rec |= json.loads(proc.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            rec["error"] = f"status {proc.returncode}: {proc.stderr[-2000:]}"
        st.res["steps"].append(rec)
        st.save()
        st.say(json.dumps(rec))


def stage_contract(st: Stage) -> None:
    # -n 0: one process (pyproject's addopts ask for two workers; two SGLang engines would share the GPU)
    cmd = [sys.executable, "-m", "pytest", "tests/engine_sglang", "-n", "0", "-q", "-rs", "-p", "no:cacheprovider",
           "-k", "not sglang-fake and not embedded-cpu", f"--timeout={int(max(30, st.left() - 10))}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=st.left() - 5)
    print(proc.stdout, proc.stderr, flush=True)
    st.res.update(returncode=proc.returncode, tail="\n".join(proc.stdout.strip().splitlines()[-25:]))
    st.save()
    if proc.returncode != 0:
        raise RuntimeError(f"pytest exited {proc.returncode}")


def run_stage(name: str, work: Path, result: Path, deadline_in: float, args) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # let `finally` stop the servers
    st = Stage(name, work, result, time.monotonic() + deadline_in)
    try:
        if name == "perf":
            stage_perf(st, args.output_len, tuple(args.n), tuple(args.perf_modes.split(",")))
        elif name == "decode":
            stage_decode(st, tuple(args.decode_cases.split(",")))
        else:
            globals()[f"stage_{name}"](st)
    except BaseException:
        st.res["error"] = traceback.format_exc()
        st.save()
        print(st.res["error"], flush=True)
        return 1
    return 0


# ---- orchestrator ----------------------------------------------------------------------------------------------


def _kill_left(work: Path) -> list[int]:
    """Kill the process groups a stage started that are still alive (its servers, if it was cut short)."""
    path, killed = work / PGIDS, []
    if not path.exists():
        return killed
    for line in path.read_text().split():
        pgid = int(line)
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed.append(pgid)
        except (ProcessLookupError, PermissionError):
            pass
    path.unlink()
    return killed


def _write(out: Path, work: Path, summary: dict) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "summary.md").write_text(summary_markdown(summary))
    with tarfile.open(out / "logs.tar.gz.part", "w:gz") as tar:
        for f in sorted(work.rglob("*")):
            if (
                f.is_file()
                and (f.suffix in (".log", ".stderr", ".json", ".tr", ".plan"))
                and f.stat().st_size < 20e6
            ):
                tar.add(f, arcname=str(f.relative_to(work)))
    (out / "logs.tar.gz.part").replace(out / "logs.tar.gz")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="summary.json, summary.md, logs.tar.gz go here")
    ap.add_argument("--work", default="/tmp/sglang-check", help="models, plans, logs")
    ap.add_argument("--deadline-s", type=float, default=480.0, help="start no stage after this")
    ap.add_argument("--stages", default=",".join(ORDER), help=f"comma-separated, from {','.join(ORDER)}")
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("-n", type=int, action="append", help="concurrencies of the perf stage (default 4, 8)")
    ap.add_argument(
        "--perf-modes", default=",".join(PERF_MODES), help="the perf stage's modes, comma-separated"
    )
    ap.add_argument("--decode-cases", default=",".join(DECODE_CASES),
                    help="the decode stage's SHAPE:ENGINE cases, comma-separated")  # fmt: skip
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--stage-deadline", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--decode-one", nargs=2, metavar=("ENGINE", "FOLDER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.n = args.n or [4, 8]
    if args.decode_one:
        print(json.dumps(decode_one(*args.decode_one)))
        return 0
    work = Path(args.work)
    if args.stage:
        return run_stage(args.stage, work, Path(args.result), args.stage_deadline, args)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if bad := [s for s in stages if s not in ORDER]:
        ap.error(f"unknown stage(s) {bad}; choose from {', '.join(ORDER)}")
    if not args.out:
        ap.error("--out is required")
    import torch

    if importlib.util.find_spec("sglang") is None or not torch.cuda.is_available():
        print("sglang check skipped: needs SGLang and a CUDA device (docs/sglang.md)", file=sys.stderr)
        return 3
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    summary: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "argv": sys.argv,
                     "stages": {}}  # fmt: skip
    for name in stages:
        left = args.deadline_s - (time.monotonic() - t_start)
        if left < MIN_S[name]:
            summary["stages"][name] = {"status": f"skipped ({left:.0f} s left, needs {MIN_S[name]})"}
            _write(out, work, summary)
            continue
        result = work / f"{name}.json"
        result.unlink(missing_ok=True)
        t0 = time.monotonic()
        print(f"[{time.strftime('%H:%M:%S')}] stage {name}: {left:.0f} s left", flush=True)
        left = min(left, MAX_S[name])
        cmd = [sys.executable, __file__, "--stage", name, "--work", str(work), "--result", str(result),
               "--stage-deadline", str(left - 10), "--output-len", str(args.output_len)]  # fmt: skip
        cmd += [f"-n{n}" for n in args.n]
        cmd += ["--perf-modes", args.perf_modes, "--decode-cases", args.decode_cases]
        with open(work / "logs" / f"{name}.log", "w") as log:
            proc = subprocess.Popen(
                cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=max(left - 5, 1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    rc = proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    rc = proc.wait()
                rc = f"timeout ({rc})"
        killed = _kill_left(work)
        res = json.loads(result.read_text()) if result.exists() else {}
        err = res.pop("error", None)
        status = "ok" if rc == 0 and not err else f"failed (exit {rc})"
        failed_parts = list(res.get("errors", {})) + [
            f"{d['shape']} {d['engine']}" for d in res.get("steps", []) if d.get("error")
        ]
        if status == "ok" and failed_parts:
            status = f"partial ({', '.join(failed_parts)} failed)"
        summary["stages"][name] = {"status": status, "seconds": time.monotonic() - t0, "result": res,
                                   "error": err, "killed_left_pgids": killed}  # fmt: skip
        if err is None and rc != 0:
            tail = (work / "logs" / f"{name}.log").read_text()[-3000:]
            summary["stages"][name]["error"] = tail
        print(
            f"[{time.strftime('%H:%M:%S')}] stage {name}: {status} in {time.monotonic() - t0:.0f} s",
            flush=True,
        )
        _write(out, work, summary)
    print(summary_markdown(summary))
    return 0 if all(st["status"] == "ok" for st in summary["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
