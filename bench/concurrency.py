"""TokenRouter against the large model alone as concurrency grows, through the CLI a user would run.

For each served configuration (`llm-only`, and TokenRouter at each `--batch` setting) one `tokenrouter serve`
starts; every N of `--n` is then a closed loop of `tokenrouter bench -c N` on it (after a short warm-up),
with each subserver's counters read from `/metrics` before and after. The table: decode tok/s, the ratio to
llm-only at the same N, TTFT p50, and per model the steps, rows per step, ms per step, the share of steps
started on the batching timeout, and the share of steps whose shape is a wide mixed batch (more than 16
rows with some row of more than one new token) or a decode wider than 64 rows. With `--auto`, each tuned row
also shows what `tokenrouter simulate` predicts for the tuned plan on the step prices profiled at that N, with
the `max_delay_ms` timeout the plan is served with: the one-GPU figure the measured cell is compared with.

    python3 bench/concurrency.py --pair 0.6b+8b --n 16,32,64,128 --batch llm=8 --batch llm=12   # GPU
    python3 bench/concurrency.py --quick                                                          # CPU
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from served import Server, exit_on_sigterm, stop_live

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {  # (small, large, mem shares); a shape name builds a config-only folder (dummy weights)
    "0.6b+8b": ("qwen3-0.6b", "qwen3-8b", (0.15, 0.7)),
    "0.6b+32b": ("qwen3-0.6b", "qwen3-32b", (0.12, 0.8)),
    "tiny": (str(ROOT / "examples/models/tiny-small"), str(ROOT / "examples/models/tiny-large"), None),
}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenrouter.cli", *args]


def model_folder(shape: str, work: Path) -> str:
    if Path(shape).is_dir():
        return shape
    folder = work / "models" / shape
    if not (folder / "config.json").is_file():
        subprocess.run(cli("make-model", str(folder), "--shape", shape), check=True, cwd=ROOT)
    return str(folder)


def make_plan(args, work: Path) -> Path:
    """The stdlib's bernoulli policy (hop small -> large with p, back after one token) on the pair, for the
    largest N, with the pair's memory shares and dummy weights on a GPU."""
    small, large, mem = PAIRS[args.pair]
    small, large = model_folder(small, work), model_folder(large, work)
    plan_path = work / f"{args.pair}-p{args.p}.plan"
    defines = {"p": str(args.p), "q": "1.0", "slm_path": small, "llm_path": large}
    cmd = cli("compile", str(ROOT / "tokenrouter/stdlib/bernoulli.tr"), "-o", str(plan_path))
    for k, v in defines.items():
        cmd += ["-D", f"{k}={v}"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    plan = json.loads(plan_path.read_text())
    plan["serve"]["concurrency"] = max(args.n)
    plan["serve"]["max_delay_ms"] = args.max_delay_ms
    for (_, spec), share, folder in zip(
        plan["models"].items(), mem or (None, None), (small, large), strict=True
    ):
        spec["gpus"] = [0]
        spec["max_len"] = args.prompt_len + args.output_len + 64
        if mem is not None:
            spec.update(mem=share, dtype="bfloat16")
            if not Path(folder, "model.safetensors").exists():
                spec["load"] = "dummy"
    from tokenrouter.compiler.passes.check_feasibility import feasibility

    plan["checks"]["feasibility"] = feasibility(plan["models"], plan["serve"]["concurrency"])
    plan_path.write_text(json.dumps(plan, indent=1))
    return plan_path


LINE = re.compile(r"^tokenrouter_(\w+)(?:\{([^}]*)\})? (\S+)$")


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    import httpx

    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if m := LINE.match(line):
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def per_model(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Each model's step counters over the measured load."""
    d: dict[str, dict[str, float]] = {}
    for (name, labels), v in after.items():
        delta = v - before.get((name, labels), 0.0)
        lab = dict(labels)
        model = lab.get("model")
        if model is None:
            continue
        m = d.setdefault(model, {"steps": 0, "rows": 0, "seconds": 0, "timeout": 0, "wide": 0})
        if name == "steps_total":
            m["steps"] += delta
        elif name == "step_rows_total":
            m["rows"] += delta
        elif name == "step_seconds_total":
            m["seconds"] += delta
        elif name == "step_starts_total" and lab.get("reason") == "timeout":
            m["timeout"] += delta
        elif name == "steps_by_shape_total":
            bs, q = int(lab["bs"]), int(lab["q"])
            if (q > 1 and bs > 16) or bs > 64:
                m["wide"] += delta
    return d


def bench(url: str, n: int, num: int, args, out: Path | None) -> dict | None:
    cmd = cli("bench", "--url", url, "-c", str(n), "-n", str(num), "--output-len", str(args.output_len),
              "--prompt-len", str(args.prompt_len), "--temperature", "0", "--no-progress")  # fmt: skip
    if out is not None:
        cmd += ["--json", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, timeout=1800)
    return json.loads(out.read_text()) if out is not None else None


def run_config(label: str, extra: list[str], plan: Path, args, work: Path) -> list[dict]:
    print(f"== {label}: serve {' '.join(extra)}", flush=True)
    tag = re.sub(r"[^\w.=-]+", "_", label)
    srv = Server(plan, extra, work / f"serve-{tag}.log", args.startup_timeout)
    print(f"   ready in {srv.startup_s:.1f} s", flush=True)
    rows = []
    try:
        for n in args.n:
            bench(srv.url, n, n, argparse.Namespace(**{**vars(args), "output_len": 16}), None)  # warm-up
            before = scrape(srv.url)
            rep = bench(srv.url, n, args.rounds * n, args, work / f"bench-{tag}-n{n}.json")
            after = scrape(srv.url)
            row = {"config": label, "n": n, "tok_s": rep["decode_throughput_tok_s"],
                   "ttft_p50_ms": rep["ttft_ms"]["p50"], "models": per_model(before, after)}  # fmt: skip
            rows.append(row)
            print(f"   N={n}: {row['tok_s']:.1f} tok/s", flush=True)
    finally:
        srv.stop()
    return rows


def tune_from_server(
    plan: Path, url: str, since: Path, prof: Path, tuned: Path, n: int, request_tokens: int, min_steps: int,
    tune_delay: bool = False,
) -> tuple[float, float]:  # fmt: skip
    """`batch: auto` by the user's flow, from a server that ran a load since `since` (its /v1/stats then):
    `profile --from-metrics` writes `prof`, `tune -n N` (with `tune_delay`, `--tune-delay`: the timeout chosen
    too) writes the tuned plan `tuned`, and `simulate` predicts the tuned plan on those step prices, with the
    `max_delay_ms` it is served with. Returns (the simulator's tok/s, the seconds `tune` took)."""
    subprocess.run(cli("profile", str(plan), "--from-metrics", url, "--since", str(since),
                       "--min-steps", str(min_steps), "-o", str(prof)), check=True, cwd=ROOT, stdout=subprocess.DEVNULL)  # fmt: skip
    t0 = time.monotonic()
    subprocess.run(cli("tune", str(plan), "--profile", str(prof), "-n", str(n), "-o", str(tuned),
                       *(["--tune-delay"] if tune_delay else [])), check=True, cwd=ROOT, stdout=subprocess.DEVNULL)  # fmt: skip
    tune_s = time.monotonic() - t0
    delay = json.loads(tuned.read_text())["serve"]["max_delay_ms"]  # the timeout it is served with
    sim = subprocess.run(cli("simulate", str(tuned), "--profile", str(prof), "-n", str(n), "--no-chain",
                             "--request-tokens", str(request_tokens), "--max-delay-ms", str(delay), "--json"),
                         check=True, cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    return json.loads(sim.stdout)["simulation"]["throughput_tok_s"], tune_s


def run_auto(plan: Path, args, work: Path, keep) -> None:
    """`batch: auto` by the user's flow, per N: serve the plan eager (every B = 1) and profile a load of N in
    flight from its stats (`profile --from-metrics URL --since FILE`), `tune -n N` on that profile, then serve the
    tuned plan and measure it."""
    import httpx

    print("== profile: serve --mode eager", flush=True)
    srv = Server(plan, ["--mode", "eager", *args.serve_arg], work / "serve-eager.log", args.startup_timeout)
    tuned: dict[int, Path] = {}  # per N: the tuned plan
    simulated: dict[int, float] = {}  # per N: the simulator's tok/s for it on the measured step prices
    try:
        for n in args.n:
            bench(srv.url, n, n, argparse.Namespace(**{**vars(args), "output_len": 16}), None)  # warm-up
            since = work / f"stats-before-n{n}.json"
            since.write_text(httpx.get(f"{srv.url}/v1/stats", timeout=30).text)
            bench(srv.url, n, 2 * args.rounds * n, args, None)
            tuned[n] = work / f"tuned-n{n}.plan"
            simulated[n], tune_s = tune_from_server(plan, srv.url, since, work / f"profile-n{n}.json", tuned[n], n,
                                                    args.output_len, args.min_steps, args.tune_delay)  # fmt: skip
            bs = {m: spec["batch"] for m, spec in json.loads(tuned[n].read_text())["models"].items()}
            print(f"   N={n}: tuned {bs} in {tune_s:.1f} s", flush=True)
    finally:
        srv.stop()
    for n in args.n:
        bs = {m: spec["batch"] for m, spec in json.loads(tuned[n].read_text())["models"].items()}
        label = "tokenrouter auto " + ",".join(f"{m}={b}" for m, b in bs.items())
        one = argparse.Namespace(**{**vars(args), "n": [n]})
        rows = run_config(label, list(args.serve_arg), tuned[n], one, work)
        keep([{**row, "simulated_tok_s": simulated[n]} for row in rows])


def table(rows: list[dict]) -> str:
    base = {r["n"]: r["tok_s"] for r in rows if r["config"] == "llm-only"}
    out = ["| config | N | tok/s | / llm-only | simulated tok/s | TTFT p50 ms | per model: steps, rows/step, ms/step, timeout %, wide % |",
           "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for r in rows:
        ratio = f"{r['tok_s'] / base[r['n']]:.2f}x" if base.get(r["n"]) else "-"
        parts = []
        for model, m in sorted(r["models"].items()):
            s = m["steps"] or 1
            parts.append(f"{model}: {m['steps']:.0f}, {m['rows'] / s:.1f}, {1e3 * m['seconds'] / s:.2f}, "
                         f"{100 * m['timeout'] / s:.0f}, {100 * m['wide'] / s:.0f}")  # fmt: skip
        sim = f"{r['simulated_tok_s']:.1f}" if r.get("simulated_tok_s") else "-"
        out.append(f"| {r['config']} | {r['n']} | {r['tok_s']:.1f} | {ratio} | {sim} | {r['ttft_p50_ms']:.0f} | "
                   + "; ".join(parts) + " |")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", choices=sorted(PAIRS), default="0.6b+8b")
    ap.add_argument("--n", default="16,32,64,128", help="concurrencies, comma-separated")
    ap.add_argument("--p", type=float, default=0.1, help="hop probability small -> large")
    ap.add_argument("--batch", action="append", default=[], metavar="MODEL=B[,MODEL=B]",
                    help="a TokenRouter configuration to serve (repeatable; none: the plan's thresholds)")  # fmt: skip
    ap.add_argument("--no-llm-only", action="store_true")
    ap.add_argument("--no-tr", action="store_true", help="without --batch/--auto: serve llm-only alone")
    ap.add_argument("--auto", action="store_true",
                    help="also TokenRouter with batch: auto tuned per N by profile -> tune -> serve")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=2, help="requests per N = ROUNDS x N")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-delay-ms", type=float, default=5.0)
    ap.add_argument("--min-steps", type=int, default=5, help="--auto: profile's --min-steps")
    ap.add_argument(
        "--tune-delay", action="store_true", help="--auto: tune --tune-delay (the timeout chosen too)"
    )
    ap.add_argument("--serve-arg", action="append", default=[], help="an extra argument for every serve")
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--work", default=None, help="models, plans, logs (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="write the rows here too")
    ap.add_argument("--quick", action="store_true", help="the tiny pair on CPU, N = 2,4, 16 tokens")
    args = ap.parse_args(argv)
    if args.quick:
        args.pair, args.n, args.output_len, args.prompt_len, args.rounds = "tiny", "2,4", 16, 16, 1
        args.min_steps = 1
        args.serve_arg = [*args.serve_arg, "--device", "cpu"]
    args.n = [int(v) for v in str(args.n).split(",")]
    import tempfile

    work = Path(args.work or tempfile.mkdtemp(prefix="tr-concurrency-"))
    work.mkdir(parents=True, exist_ok=True)
    plan = make_plan(args, work)
    configs = [] if args.no_llm_only else [("llm-only", ["--mode", "llm-only"])]
    for b in args.batch or ([] if args.auto or args.no_tr else [""]):
        flags = [f for kv in b.split(",") if kv for f in ("--batch", kv)]
        configs.append((f"tokenrouter {b}".strip(), flags))
    rows = []

    def keep(new: list[dict]) -> None:  # the JSON is rewritten after each served configuration
        rows.extend(new)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))

    for label, flags in configs:
        keep(run_config(label, [*flags, *args.serve_arg], plan, args, work))
    if args.auto:
        run_auto(plan, args, work, keep)
    print(table(rows))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        raise SystemExit(main())
    finally:
        stop_live()
