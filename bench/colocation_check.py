"""Would a co-location term put the throughput model's ranking of thresholds right? An offline check on the raw
results of matrix runs served at fixed thresholds (`bench/matrix.py --thresholds`, runs 42-44).

The DTMC takes each model's step latency as a function of its own batch size only. On one GPU the small
model's step is shorter when the large one beside it is busy less (runs 42-44: 1.2-1.55 ms per unit of the
8B's busy share). Here every model's latency curve comes from the run's eager server (its /metrics deltas,
stalls included as the run had them) and gets a term

    L_i(b) + S_i * (U_j - U_j(eager))

where U_j is the other model's utilization in the chain at the thresholds evaluated and U_j(eager) the
chain's at B = 1; the chain is solved again until U_j settles (damped fixed point). S = 0 is the plain DTMC
on the eager run's latencies. For each TokenRouter run of the results: measured tok/s, both predictions as
a ratio to the chain's eager, measured / co-located prediction, and the 8B's utilization in the chain against
the run's measured busy share.

    python bench/colocation_check.py docs/matrix/run44-results.tar.gz --slowdown slm=1.3
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODELS = ("slm", "llm")  # the matrix's pairs: entry first


def load(path: str) -> tuple[dict[str, dict], dict]:
    """The run records of a results tarball ({file name: record}) and its served profile at N = 8."""
    records, profile = {}, None
    try:
        tar = tarfile.open(path)
    except (OSError, tarfile.TarError) as e:
        raise SystemExit(f"error: {path}: not a readable results tarball ({e})") from None
    with tar:
        for m in tar.getmembers():
            name = Path(m.name).name
            if name.startswith("record-") and name.endswith(".json"):
                records[name] = json.load(tar.extractfile(m))
            elif re.fullmatch(r"profile-n\d+\.json", name):
                profile = json.load(tar.extractfile(m))
    if profile is None or not any(r["mode"] == "eager" for r in records.values()):
        raise SystemExit(f"error: {path} has no served profile or no eager run")
    return records, profile


def measured(rec: dict, min_steps: int = 5) -> tuple[dict[str, list[tuple[int, float]]], dict[str, float]]:
    """A run's step latency by batch size (ms, batch sizes seen min_steps times) and busy share per model."""
    after, before = rec["metrics_after"], rec["metrics_before"]

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    curves, busy = {}, {}
    for model in MODELS:
        pts = []
        for key in after:
            found = re.fullmatch(rf'tokenrouter_steps_by_batch_total\{{model="{model}",bs="(\d+)"\}}', key)
            if found and delta(key) >= min_steps:
                bs = found.group(1)
                seconds = delta(f'tokenrouter_step_seconds_by_batch_total{{model="{model}",bs="{bs}"}}')
                pts.append((int(bs), 1000.0 * seconds / delta(key)))
        curves[model] = sorted(pts)
        busy[model] = delta(f'tokenrouter_step_seconds_total{{model="{model}"}}') / rec["report"]["wall_s"]
    return curves, busy


def predict(curves, p, n: int, thresholds: tuple[int, ...], slowdown: dict[str, float], rounds: int = 60):
    """(throughput, utilizations) of the chain with the co-location term, and the plain chain's throughput."""
    from tokenrouter.compiler.throughput.dtmc import analyze
    from tokenrouter.compiler.throughput.inputs import StepLatency, make_inputs

    def system(shift: dict[str, float]):
        step = {m: StepLatency(tuple((b, max(0.05, ms + shift[m])) for b, ms in curves[m])) for m in MODELS}
        return make_inputs(MODELS, step, p, [[1.0, 1.0], [1.0, 1.0]], n, entry=MODELS[0])

    plain = system(dict.fromkeys(MODELS, 0.0))
    eager = analyze(plain, (1,) * len(MODELS))
    u0 = u = eager.utilization
    for _ in range(rounds):
        shift = {m: slowdown.get(m, 0.0) * (u[1 - i] - u0[1 - i]) for i, m in enumerate(MODELS)}
        res = analyze(system(shift), thresholds)
        u, last = tuple(0.5 * a + 0.5 * b for a, b in zip(u, res.utilization, strict=True)), u
        if max(abs(a - b) for a, b in zip(u, last, strict=True)) < 1e-5:  # settled
            break
    return res.throughput, u, analyze(plain, thresholds).throughput, eager.throughput


def report(path: str, slowdown: dict[str, float]) -> list[str]:
    records, profile = load(path)
    routing = profile["routing"]
    p = [[routing[a].get(b, 0.0) for b in MODELS] for a in MODELS]
    eager = next(r for r in records.values() if r["mode"] == "eager")
    curves, busy = measured(eager)
    eager_tok = eager["report"]["decode_throughput_tok_s"]
    lines = [
        f"{Path(path).name}: eager {eager_tok:.0f} tok/s, busy {busy['slm']:.2f} / {busy['llm']:.2f} (slm / llm); "
        f"co-location term {', '.join(f'{m} {s:g} ms' for m, s in slowdown.items()) or 'none'}\n",
        "| B (slm, llm) | measured tok/s | / eager | plain DTMC / its eager | co-located / its eager | "
        "measured / co-located | llm utilization: chain / measured |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    rows = []
    for rec in records.values():
        if rec["mode"] != "tokenrouter":
            continue
        b = tuple(int(rec["thresholds"][m]) for m in MODELS)
        co, u, plain, plain_eager = predict(curves, p, rec["n"], b, slowdown)
        tok = rec["report"]["decode_throughput_tok_s"]
        rows.append((b, f"| {b} | {tok:.0f} | {tok / eager_tok:.2f}x | {plain / plain_eager:.2f}x | "
                        f"{co / plain_eager:.2f}x | {tok / co:.2f}x | {u[1]:.2f} / {measured(rec)[1]['llm']:.2f} |"))  # fmt: skip
    return lines + [row for _, row in sorted(rows)] + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "results", nargs="+", help="results-*.tar.gz of bench/matrix.py runs (eager + tokenrouter)"
    )
    ap.add_argument("--slowdown", action="append", default=[], metavar="MODEL=MS",
                    help="S_i: ms added to MODEL's step per unit of the other model's utilization above eager's")  # fmt: skip
    a = ap.parse_args(argv)
    slowdown = {}
    for item in a.slowdown:
        model, _, ms = item.partition("=")
        if model not in MODELS:
            print(f"error: --slowdown {item!r}: MODEL is one of {', '.join(MODELS)}", file=sys.stderr)
            return 2
        try:
            slowdown[model] = float(ms)
        except ValueError:
            print(f"error: --slowdown {item!r}: expected MODEL=MS", file=sys.stderr)
            return 2
    for path in a.results:
        print("\n".join(report(path, slowdown)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
