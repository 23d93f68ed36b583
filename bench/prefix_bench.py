"""The prefix-cache benchmark of issue 59: one command serves each deployment in turn and prints, side by side:

(a) a shared-prefix load (a 3,000-token prefix shared by every request + 24 tokens of its own, 32 requests,
    128 output tokens, c = 8) for TokenRouter, std-serving, llm-only with its prefix cache, and llm-only
    without (`--no-prefix-cache`);
(b) multi-turn chat (16 conversations at once, 8 turns, a 1,000-token system prompt, 50-token user messages,
    200-token answers) for TokenRouter and llm-only, both with the cache: decode throughput and TTFT p50 by
    turn;
(c) the paper's shape (64-token unique prompts, N = 4, 512 output tokens) for TokenRouter with the cache and
    without (what a miss costs).

The pair is the matrix's 0.6B + 8B Qwen3 shapes with dummy weights on one GPU (memory shares 0.15 / 0.7), the
policy the stdlib's `bernoulli` with p = 0.1, q = 1 and thresholds B = (1, 2) ("TokenRouter, B llm 8": (1, 8)). Each deployment is a real
`tokenrouter serve PLAN --mode M` (started once, and serving every load it appears in); each load goes after a
warm-up round of other prompts, through the load generator of `tokenrouter bench`, whose report adds the prefix
hit rate per model from /metrics.

    python bench/prefix_bench.py --out /tmp/prefix            # the GPU run (about 15 minutes on an H100)
    python bench/prefix_bench.py --quick --out /tmp/prefix    # tiny models on CPU, small sizes (a few minutes)

Where one call may not take that long, split it with `--only` and `--keep` (the second call's tables show both):

    python bench/prefix_bench.py --out DIR --only TokenRouter --only "TokenRouter, no cache" --only std-serving
    python bench/prefix_bench.py --out DIR --keep --only llm-only --only "llm-only, no cache"

A load's throughput can spread by several percent between runs on one server (8 % on the chat load on an H100):
`--repeats 3` runs each load three times with other prompts and reports the median run with the range.

A serving option tried against the default: `--serve-arg` passes a flag to every TokenRouter `serve` of the call
(the auto flow's eager profile and tuned server too) and `--tag` names the variant, whose rows then sit beside
the untagged ones (with `--keep`), e.g. the 8B's kernels capped at 60 % of the SMs under MPS:

    python bench/prefix_bench.py --out DIR --load chat --only llm-only --only "TokenRouter, auto"
    python bench/prefix_bench.py --out DIR --keep --load chat --only "TokenRouter, auto" \
        --serve-arg=--mps-sm=llm=60 --tag "8B at 60 % SMs"

Writes `prefix-bench.json` (every report) and `prefix-bench.md` (the tables, as printed) under --out, and the
servers' stderr; `--tables` prints the tables again from them. Exit status 0 when every load completed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import sglang_only as so
from concurrency import tune_from_server
from served import Server, exit_on_sigterm, stop_live

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MAX_LEN = 4096


@dataclass(frozen=True)
class Sizes:
    shared_prefix: int = 3000
    own: int = 24
    shared_requests: int = 32
    shared_output: int = 128
    shared_c: int = 8
    turns: int = 8
    system: int = 1000
    user: int = 50
    answer: int = 200
    conversations: int = 16
    paper_prompt: int = 64
    paper_output: int = 512
    paper_requests: int = 32
    paper_c: int = 4


QUICK = Sizes(shared_prefix=96, own=8, shared_requests=8, shared_output=16, shared_c=4, turns=3, system=48,
              user=8, answer=12, conversations=4, paper_prompt=64, paper_output=16, paper_requests=8, paper_c=4)  # fmt: skip

SGLANG = "SGLang, 8B alone"
AUTO = "TokenRouter, auto"  # `batch: auto` tuned per load by the user's flow (`run_auto`)
# SGLang's --mem-fraction-static: the GPU is its own (TokenRouter's two shares are 0.85 too)
SGLANG_MEM = 0.85
# deployment -> (serve --mode, extra serve flags, the loads it serves); mode "sglang": SGLang's own server
DEPLOYMENTS = {
    "TokenRouter": ("tokenrouter", (), ("shared", "chat", "paper")),
    "TokenRouter, no cache": ("tokenrouter", ("--no-prefix-cache",), ("paper",)),
    "TokenRouter, B llm 8": ("tokenrouter", ("--batch", "llm=8"), ("shared", "chat")),
    AUTO: ("auto", (), ("shared", "chat")),
    "std-serving": ("std-serving", (), ("shared",)),
    "llm-only": ("llm-only", (), ("shared", "chat")),
    "llm-only, no cache": ("llm-only", ("--no-prefix-cache",), ("shared",)),
    SGLANG: ("sglang", (), ("shared", "chat")),
}


class SGLangServer:
    """SGLang's own HTTP server on the 8B alone (`bench/sglang_only.py`'s command: dummy weights, triton
    attention, its radix cache on), with the `Server` interface the loop uses; RuntimeError if it never
    answers or SGLang is absent."""

    def __init__(self, model_path: str, log: Path, sglang_path: str | None, timeout: float = 900.0) -> None:
        if why := so.sglang_available(sglang_path):
            raise RuntimeError(why)
        args = argparse.Namespace(model_path=model_path, load_format="dummy", dtype="bfloat16", sglang_path=sglang_path,
                                  mem_fraction_static=SGLANG_MEM, max_running_requests=None, server_arg=None)  # fmt: skip
        port = so.free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.err = open(log, "w")  # noqa: SIM115 - closed in stop()
        t0 = time.monotonic()
        self.proc = so.start_server(args, port, stdout=self.err, stderr=self.err)
        try:
            so.wait_ready(self.proc, self.url, timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0

    def stop(self) -> None:
        so.stop(self.proc)
        self.err.close()


def make_plan(out: Path, quick: bool, device: str, auto: bool = False) -> Path:
    """The benchmark's plan: bernoulli.tr on the pair at B = (1, 2), or with `auto` at `batch: auto` (for `tune`
    to choose; a plan with B given keeps it)."""
    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.compiler.passes.check_feasibility import feasibility
    from tokenrouter.compiler.plan import write_plan
    from tokenrouter.runtime.engine.make_model import make_model, shape_for

    if quick:
        folders = [str(ROOT / "examples/models/tiny-small"), str(ROOT / "examples/models/tiny-large")]
    else:
        folders = []
        for shape in ("qwen3-0.6b", "qwen3-8b"):
            folder = out / "models" / shape
            if not (folder / "config.json").is_file():
                make_model(folder, shape_for(shape), seed=0, weights=False, force=True)
            folders.append(str(folder))
    res = compile_file(ROOT / "tokenrouter/stdlib/bernoulli.tr",
                       {"slm_path": folders[0], "llm_path": folders[1], "p": "0.1", "q": "1.0"})  # fmt: skip
    if res.plan is None:
        raise SystemExit(f"bernoulli.tr did not compile: {[str(d) for d in res.diagnostics]}")
    plan = res.plan
    for (_, spec), batch, mem, folder in zip(
        plan["models"].items(), (1, 2), (0.15, 0.7), folders, strict=True
    ):
        spec.update(gpus=[0], max_len=MAX_LEN, batch="auto" if auto else batch)
        if device != "cpu":
            load = "auto" if Path(folder, "model.safetensors").exists() else "dummy"
            spec.update(mem=mem, dtype="bfloat16", load=load)
    plan["checks"]["feasibility"] = feasibility(plan["models"], plan["serve"]["concurrency"])
    path = out / ("prefix-bench-auto.plan" if auto else "prefix-bench.plan")
    write_plan(plan, path)
    return path


def load_spec(kind: str, url: str, z: Sizes, repeat: int = 0):
    from tokenrouter.loadgen.bench import LoadSpec

    # a seed per load and repeat: no run's synthetic tokens start like another's (the cache would match across)
    seed = {"shared": 1, "chat": 2, "paper": 3}[kind] + 10 * repeat
    common = dict(url=url, temperature=0.0, progress=False, seed=seed)
    if kind == "shared":
        return LoadSpec(concurrency=z.shared_c, num_prompts=z.shared_requests, warmup=z.shared_c,
                        shared_prefix_len=z.shared_prefix, prompt_len=z.own, output_len=z.shared_output, **common)  # fmt: skip
    if kind == "chat":
        return LoadSpec(concurrency=z.conversations, num_prompts=z.conversations, warmup=z.conversations,
                        turns=z.turns, system_len=z.system, prompt_len=z.user, output_len=z.answer, **common)  # fmt: skip
    return LoadSpec(concurrency=z.paper_c, num_prompts=z.paper_requests, warmup=z.paper_c,
                    prompt_len=z.paper_prompt, output_len=z.paper_output, **common)  # fmt: skip


def measure(kind: str, url: str, z: Sizes, repeats: int = 1) -> dict:
    """The load run `repeats` times on one server, each run with its own seed (its prompts match no other run's
    in the prefix cache): the report of the median run by decode throughput, with every run's in
    `repeats_tok_s` where there are several."""
    from tokenrouter.loadgen.bench import run_load

    reps = [asyncio.run(run_load(load_spec(kind, url, z, k))) for k in range(repeats)]
    rep = sorted(reps, key=lambda r: r["decode_throughput_tok_s"])[(len(reps) - 1) // 2]
    if repeats > 1:
        rep["repeats_tok_s"] = [r["decode_throughput_tok_s"] for r in reps]
    return rep


def load_concurrency(kind: str, z: Sizes) -> int:
    return {"shared": z.shared_c, "chat": z.conversations, "paper": z.paper_c}[kind]


def run_auto(
    plan: Path,
    kinds,
    z: Sizes,
    out: Path,
    device: str,
    min_steps: int = 5,
    repeats: int = 1,
    serve_args: tuple[str, ...] = (),
    slug: str = "tokenrouter-auto",
) -> dict[str, dict]:
    """The reports of `batch: auto` by the user's flow, per load: the plan served eager (every B = 1) runs the
    load, `profile --from-metrics` reads that run's step prices from the server, `tune -n N --tune-delay` (N: the
    load's concurrency; the timeout chosen with the thresholds) writes the tuned plan, and the tuned plan is
    served and runs the load again. Each report adds the tuned thresholds and timeout, and what `simulate`
    predicts for the tuned plan on those prices. `serve_args` go to both servers; `slug` names their logs."""
    import httpx

    from tokenrouter.loadgen.bench import run_load

    tuned, sims = {}, {}
    srv = Server(plan, ["--mode", "eager", "--device", device, *serve_args], out / f"{slug}-eager.stderr")
    try:
        for kind in kinds:
            n = load_concurrency(kind, z)
            since = out / f"{slug}-stats-before-{kind}.json"
            since.write_text(httpx.get(f"{srv.url}/v1/stats", timeout=30).text)
            asyncio.run(run_load(load_spec(kind, srv.url, z)))
            tuned[kind] = out / f"{slug}-tuned-{kind}.plan"
            output = z.answer if kind == "chat" else z.shared_output
            sims[kind], _ = tune_from_server(plan, srv.url, since, out / f"{slug}-profile-{kind}.json", tuned[kind], n,
                                             output, min_steps, tune_delay=True)  # fmt: skip
    finally:
        srv.stop()
    reports = {}
    for kind in kinds:
        chosen = json.loads(tuned[kind].read_text())
        batch = {m: spec["batch"] for m, spec in chosen["models"].items()}
        server = Server(
            tuned[kind],
            ["--mode", "tokenrouter", "--device", device, *serve_args],
            out / f"{slug}-{kind}.stderr",
        )
        try:
            reports[kind] = measure(kind, server.url, z, repeats)
        finally:
            server.stop()
        reports[kind].update(
            tuned_batch=batch, tuned_delay_ms=chosen["serve"]["max_delay_ms"], simulated_tok_s=sims[kind]
        )
    return reports


def tuned(rep: dict) -> str:
    """A report's tuned thresholds and simulated tok/s (the `TokenRouter, auto` rows), or "-"."""
    if "tuned_batch" not in rep:
        return "-"
    bs = ", ".join(f"{m} {b}" for m, b in rep["tuned_batch"].items())
    delay = f", {rep['tuned_delay_ms']:g} ms" if "tuned_delay_ms" in rep else ""
    return f"B {bs}{delay}; simulated {fmt(rep.get('simulated_tok_s'))}"


def tok_s(rep: dict) -> str:
    """A report's decode tok/s, with the range of its repeats (`--repeats`) where it has several."""
    runs = rep.get("repeats_tok_s") or []
    spread = f" ({min(runs):.0f}-{max(runs):.0f})" if len(runs) > 1 else ""
    return fmt(rep["decode_throughput_tok_s"]) + spread


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or not b["decode_throughput_tok_s"]:
        return "-"
    return f"{a['decode_throughput_tok_s'] / b['decode_throughput_tok_s']:.2f}x"


def hits(rep: dict) -> str:
    pc = rep.get("prefix_cache") or {}
    return (
        ", ".join(f"{m} {100 * v['hit_rate']:.0f}%" if v["enabled"] else f"{m} off" for m, v in pc.items())
        or "-"
    )


def tagged(name: str, tag: str | None) -> str:
    """A deployment's name in the reports: with `--tag`, "NAME [TAG]"."""
    return f"{name} [{tag}]" if tag else name


def with_variants(results: dict[tuple[str, str], dict], names, kind: str) -> list[str]:
    """`names` in order, each followed by its tagged variants (`tagged`) that ran `kind`."""
    out = []
    for name in names:
        out.append(name)
        out += [n for n, k in results if k == kind and n.startswith(f"{name} [") and n.endswith("]")]
    return out


def tables(
    results: dict[tuple[str, str], dict], z: Sizes, sizes: dict[str, tuple[int, int]] | None = None
) -> str:
    def tr(kind: str) -> dict | None:  # the first TokenRouter deployment run: the one the column compares
        return next(
            filter(None, (results.get((x, kind)) for x in ("TokenRouter", "TokenRouter, B llm 8", AUTO))),
            None,
        )

    lines = [f"(a) shared prefix: {z.shared_prefix} shared + {z.own} own tokens, {z.shared_requests} requests, "
             f"{z.shared_output} output tokens, c = {z.shared_c}", "",
             "| deployment | decode tok/s | TTFT p50 (ms) | TTFT p99 (ms) | TokenRouter vs it | prefix hits | tuned |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- |"]  # fmt: skip
    shared = (
        "TokenRouter",
        "TokenRouter, B llm 8",
        AUTO,
        "std-serving",
        "llm-only",
        "llm-only, no cache",
        SGLANG,
    )
    for name in with_variants(results, shared, "shared"):
        if rep := results.get((name, "shared")):
            lines.append(f"| {name} | {tok_s(rep)} | {fmt(rep['ttft_ms']['p50'])} | "
                         f"{fmt(rep['ttft_ms']['p99'])} | {ratio(tr('shared'), rep)} | {hits(rep)} | {tuned(rep)} |")  # fmt: skip
    turns = range(1, z.turns + 1)
    lines += ["", f"(b) multi-turn chat: {z.conversations} conversations at once, {z.turns} turns, system prompt "
              f"{z.system}, user messages {z.user}, answers {z.answer}", "",
              "| deployment | decode tok/s | vs llm-only | TokenRouter vs it | "
              + " | ".join(f"TTFT p50 t{k}" for k in turns) + f" | t{z.turns}/t1 | prefix hits | tuned |",
              "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in turns) + " | ---: | --- | --- |"]  # fmt: skip
    chat = ("TokenRouter", "TokenRouter, B llm 8", AUTO, "llm-only", SGLANG)
    for name in with_variants(results, chat, "chat"):
        if rep := results.get((name, "chat")):
            by = rep.get("ttft_ms_by_turn") or {}
            p50 = [by.get(str(k), {}).get("p50") for k in turns]
            last = fmt(p50[-1] / p50[0], ".2f") if p50[0] and p50[-1] else "-"
            lines.append(f"| {name} | {tok_s(rep)} | {ratio(rep, results.get(('llm-only', 'chat')))} | "
                         f"{ratio(tr('chat'), rep)} | " + " | ".join(fmt(v) for v in p50) + f" | {last} | {hits(rep)} | {tuned(rep)} |")  # fmt: skip
    lines += ["", f"(c) the paper's shape: {z.paper_prompt}-token unique prompts, N = {z.paper_c}, "
              f"{z.paper_output} output tokens", "",
              "| deployment | decode tok/s | TTFT p50 (ms) | vs no cache | prefix hits |", "| --- | ---: | ---: | ---: | --- |"]  # fmt: skip
    off = results.get(("TokenRouter, no cache", "paper"))
    for name in with_variants(results, ("TokenRouter", "TokenRouter, no cache"), "paper"):
        if rep := results.get((name, "paper")):
            lines.append(f"| {name} | {tok_s(rep)} | {fmt(rep['ttft_ms']['p50'])} | "
                         f"{ratio(rep, off)} | {hits(rep)} |")  # fmt: skip
    return "\n".join(lines + time_table(results) + bytes_table(results, z, sizes or {}))


def time_table(results: dict[tuple[str, str], dict]) -> list[str]:
    """(d) Where each TokenRouter-served run's time went, per model: steps, ms per step (forward and route
    kernel), rows and tokens per step (tokens > rows: prefills and the extends of returning requests), and the
    share of the load's wall time the model spent in steps."""
    rows = [
        f"| {name} | {kind} | {model} | {st['steps']} | {st['ms_per_step']:.2f} | {st['rows_per_step']:.2f} | "
        f"{st['tokens_per_step']:.1f} | {st['busy']:.0%} |"
        for (name, kind), rep in results.items()
        for model, st in (rep.get("steps_by_model") or {}).items()
    ]
    if not rows:
        return []
    return ["", "(d) where the time went: each model's steps during the load", "",
            "| deployment | load | model | steps | ms / step | rows / step | tokens / step | busy |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |", *rows]  # fmt: skip


def model_bytes(plan: Path) -> dict[str, tuple[int, int]]:
    """Each model's weight bytes and KV bytes per token, in the plan's dtype (as `serve` sizes its share); empty
    where the plan or a model's config is not there."""
    from tokenrouter.compiler.plan import PlanError, read_plan
    from tokenrouter.runtime.memory_share import MemoryFitError, model_need

    try:
        needs = {name: model_need(spec) for name, spec in read_plan(plan)["models"].items()}
    except (PlanError, MemoryFitError):  # no plan or no model config there: no table (e)
        return {}
    return {name: (n.weight_bytes, n.kv_bytes_per_token) for name, n in needs.items()}


def mean_context(kind: str, z: Sizes) -> float:
    """The mean context a decode row reads during a load: its prompt and half its answer (chat: over the turns,
    each turn's prompt holding the earlier turns)."""
    if kind == "shared":
        return z.shared_prefix + z.own + z.shared_output / 2
    if kind == "chat":
        return z.system + (z.turns - 1) / 2 * (z.user + z.answer) + z.user + z.answer / 2
    return z.paper_prompt + z.paper_output / 2


def bytes_table(
    results: dict[tuple[str, str], dict], z: Sizes, sizes: dict[str, tuple[int, int]]
) -> list[str]:
    """(e) An estimate of the bytes each run read from GPU memory, from its steps (table d): every step reads its
    model's weights once and each row's KV at the load's mean context (`mean_context`). Per output token, the
    bandwidth that implies over the load's wall time, and the 8B alone's bytes per token over the run's: what
    the run would serve against the 8B alone at equal bandwidth."""
    per_token, rows = {}, []
    for (name, kind), rep in results.items():
        steps, out, wall = rep.get("steps_by_model"), rep.get("output_tokens"), rep.get("wall_s")
        if not steps or not out or not wall or not set(steps) <= set(sizes):
            continue
        ctx = mean_context(kind, z)
        read = sum(
            st["steps"] * (sizes[m][0] + st["rows_per_step"] * ctx * sizes[m][1]) for m, st in steps.items()
        )
        per_token[(name, kind)] = read / out
        rows.append((name, kind, read / out, read / wall))
    if not rows:
        return []
    lines = ["", "(e) bytes read from GPU memory (an estimate: weights once per step, each row's KV at the load's "
             "mean context)", "", "| deployment | load | GB / output token | TB/s | the 8B alone's bytes / its |",
             "| --- | --- | ---: | ---: | ---: |"]  # fmt: skip
    for name, kind, gb, bw in rows:
        alone = per_token.get(("llm-only", kind))
        lines.append(
            f"| {name} | {kind} | {gb / 1e9:.3f} | {bw / 1e12:.2f} | {fmt(alone / gb if alone else None, '.2f')} |"
        )
    return lines


def save(results: dict[tuple[str, str], dict], z: Sizes, out: Path, plan: Path | None = None) -> str:
    """Write prefix-bench.json (every report) and prefix-bench.md (the tables) under `out`; returns the tables."""
    from tokenrouter.outfile import finite_json

    text = tables(results, z, model_bytes(plan) if plan else None)
    (out / "prefix-bench.md").write_text(text + "\n")
    records = [{"deployment": n, "load": k, "report": r} for (n, k), r in results.items()]
    (out / "prefix-bench.json").write_text(
        json.dumps(finite_json({"sizes": z.__dict__, "runs": records}), indent=2)
    )
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out", required=True, help="Folder for the plan, the models' configs, the reports and logs."
    )
    ap.add_argument("--quick", action="store_true", help="The tiny example models on CPU, at small sizes.")
    ap.add_argument("--device", choices=("cpu", "cuda"), help="Default: cuda, or cpu with --quick.")
    ap.add_argument("--only", action="append", choices=sorted(DEPLOYMENTS),
                    help="Serve only these deployments (repeatable); default all.")  # fmt: skip
    ap.add_argument("--load", action="append", choices=("shared", "chat", "paper"),
                    help="Run only these loads (repeatable); default every load of each deployment.")  # fmt: skip
    ap.add_argument("--sglang-path", help=f"An unpacked SGLang bundle for the {SGLANG!r} deployment "
                    "(docs/sglang.md), on its server's PYTHONPATH only.")  # fmt: skip
    ap.add_argument("--keep", action="store_true",
                    help="Add to the reports already in --out (an earlier call's --only), so that the tables "
                    "show every deployment measured there; a deployment measured again replaces its rows.")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=1,
                    help="Run each load this many times on its server, each with other prompts; the tables show "
                    "the median run, with the range.")  # fmt: skip
    ap.add_argument("--serve-arg", action="append", default=[], metavar="FLAG",
                    help="A flag for every TokenRouter `serve` of this call (repeatable; write it as "
                    "--serve-arg=--mps-sm=llm=60); SGLang's server is left alone.")  # fmt: skip
    ap.add_argument("--tag", help="Record this call's deployments as 'NAME [TAG]' (beside the untagged ones, "
                    "with --keep): the variant --serve-arg makes.")  # fmt: skip
    ap.add_argument("--tables", action="store_true",
                    help="Serve nothing: print the tables again from the reports in --out (prefix-bench.json).")  # fmt: skip
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.tag is not None and not re.fullmatch(r"[^\[\]]+", args.tag):
        ap.error(f"--tag must be non-empty text without brackets, got {args.tag!r}")
    serve_args = tuple(args.serve_arg)
    device = args.device or ("cpu" if args.quick else "cuda")
    z = QUICK if args.quick else Sizes()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = make_plan(out, args.quick, device)

    results: dict[tuple[str, str], dict] = {}
    saved = out / "prefix-bench.json"
    if args.tables:
        if not saved.is_file():
            raise SystemExit(f"{saved}: no reports to print")
        results = {(r["deployment"], r["load"]): r["report"] for r in json.loads(saved.read_text())["runs"]}
        print(save(results, z, out, plan))
        return 0
    if args.keep and saved.is_file():
        remeasured = {tagged(name, args.tag) for name in args.only or ()}  # the rest: replaced as measured
        for rec in json.loads(saved.read_text())["runs"]:
            if rec["deployment"] not in remeasured:
                results[(rec["deployment"], rec["load"])] = rec["report"]
    failed = []
    for name, (mode, extra, kinds) in DEPLOYMENTS.items():
        kinds = tuple(k for k in kinds if not args.load or k in args.load)
        if (args.only and name not in args.only) or not kinds:
            continue
        if mode != "sglang":
            extra = (*extra, *serve_args)
        name = tagged(name, args.tag)
        slug = re.sub(r"\W+", "-", name.lower()).strip("-")
        t0 = time.monotonic()
        print(f"[{time.strftime('%H:%M:%S')}] {name}: serve --mode {mode} {' '.join(extra)}", flush=True)
        if mode == "auto":
            try:
                auto = make_plan(out, args.quick, device, auto=True)
                for kind, rep in run_auto(
                    auto, kinds, z, out, device, 1 if args.quick else 5, args.repeats, extra, slug
                ).items():
                    results[(name, kind)] = rep
                    print(f"  {kind}: {rep['completed']}/{rep['requests']} ok, {rep['decode_throughput_tok_s']:.1f} tok/s, "
                          f"{tuned(rep)}", flush=True)  # fmt: skip
                    if rep["failed"]:
                        failed.append(f"{name} {kind}: {rep['failed']} failed: {'; '.join(rep['errors'])}")
            except (RuntimeError, subprocess.CalledProcessError) as e:
                failed.append(f"{name}: {e}")
                print(f"  {e}", flush=True)
            save(results, z, out, plan)
            continue
        try:
            if mode == "sglang":
                server = SGLangServer(
                    str(out / "models" / "qwen3-8b"), out / f"{slug}.stderr", args.sglang_path
                )
            else:
                server = Server(plan, ["--mode", mode, "--device", device, *extra], out / f"{slug}.stderr")
        except RuntimeError as e:
            failed.append(f"{name}: {e}")
            print(f"  {e}", flush=True)
            continue
        try:
            print(f"  started in {time.monotonic() - t0:.0f} s", flush=True)
            for kind in kinds:
                t1 = time.monotonic()
                rep = measure(kind, server.url, z, args.repeats)
                results[(name, kind)] = rep
                print(f"  {kind}: {rep['completed']}/{rep['requests']} ok, {rep['decode_throughput_tok_s']:.1f} tok/s, "
                      f"TTFT p50 {rep['ttft_ms']['p50']:.1f} ms, prefix hits {hits(rep)} ({time.monotonic() - t1:.0f} s)",
                      flush=True)  # fmt: skip
                if rep["failed"]:
                    failed.append(f"{name} {kind}: {rep['failed']} failed: {'; '.join(rep['errors'])}")
        finally:
            server.stop()
        save(results, z, out, plan)  # after each deployment: an interrupted run keeps what it measured
    text = save(results, z, out, plan)
    print("\n" + text)
    for f in failed:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        raise SystemExit(main())
    finally:
        stop_live()
