"""The simulator's open loop (`SimConfig.arrival_rate_per_s`, `tokenrouter simulate --request-rate`) against runs
155, 156 and 159 (forty-second session): each served row simulated on its own measured step times, thresholds,
hop delays and max delay, at its offered rate and cap (three seeds, 600 s after a 10 s warm-up), and the
latencies set side by side with the measured.

Usage: python3 docs/raw/offline-42/openloop_check.py docs/raw/run-a14/call{1,2,5}/run*/results-*.tar.gz
"""

import importlib.util
import re
import sys
from pathlib import Path

from tokenrouter.compiler.throughput.inputs import StepLatency, make_inputs
from tokenrouter.compiler.throughput.simulate import SimConfig, simulate
from tokenrouter.runtime.loadgen import _spread

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("matrix", ROOT / "bench" / "matrix.py")
matrix = importlib.util.module_from_spec(spec)
sys.modules["matrix"] = matrix
spec.loader.exec_module(matrix)

SEEDS = 3
BY_BATCH = re.compile(r'tokenrouter_step(s|_seconds)_by_batch_total\{model="llm",bs="(\d+)"\}')


def one_model(rec: dict):
    """llm-only's one model as the simulator's system: its step latency by batch size from the run's own
    scrapes (every batch size seen 5 times or more), routing nowhere else."""
    sums: dict[int, list[float]] = {}
    for key, after in rec["metrics_after"].items():
        if found := BY_BATCH.fullmatch(key):
            kind, bs = found.group(1), int(found.group(2))
            sums.setdefault(bs, [0.0, 0.0])[kind == "_seconds"] += after - rec["metrics_before"].get(key, 0.0)
    points = tuple((bs, 1000.0 * sec / n) for bs, (n, sec) in sorted(sums.items()) if n >= 5)
    return make_inputs(["llm"], {"llm": StepLatency(points)}, [[1.0]], [[1.0]], rec["n"]), (1,)


def simulated(rec: dict) -> dict:
    inputs, b = one_model(rec) if rec["mode"] == "llm-only" else matrix.run_system(rec)
    hop_ms = matrix.run_hop_ms(rec, inputs.models) if len(inputs.models) > 1 else None
    held = any("starts_held" in d for d in matrix.step_deltas(rec).values())
    out = []
    for seed in range(SEEDS):
        cfg = SimConfig(b, seed=seed, request_tokens=rec["output_len"], arrival_rate_per_s=rec["request_rate"],
                        max_delay_ms=rec["max_delay_ms"], hop_ms=hop_ms, held_rule=held, horizon_ms=600_000.0,
                        warmup_ms=10_000.0)  # fmt: skip
        out.append(simulate(inputs, cfg).latency)
    mean = {
        k: sum(x[k]["p50"] for x in out) / SEEDS
        for k in ("tpot_ms", "e2e_ms", "queued_ms", "from_arrival_ms")
    }
    return mean | {
        "queued_p99": sum(x["queued_ms"]["p99"] for x in out) / SEEDS,
        "from_arrival_p99": sum(x["from_arrival_ms"]["p99"] for x in out) / SEEDS,
        "backlog": max(x["backlog"] for x in out),
    }


def main() -> None:
    print(
        "| offered req/s | mode | B | TPOT p50 ms: measured / simulated | E2E p50 s | queued at the cap p50 / p99 ms "
        "| from arrival to end p50 s (p99) | backlog at the end, simulated |"
    )
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for rec in matrix.load_records(sys.argv[1:]):
        rep, sim = rec["report"], simulated(rec)
        arrival = _spread([r["queued_s"] + r["e2e_s"] for r in rep["per_request"] if r["ok"]])
        print(
            f"| {rec['request_rate']:g} | {rec['mode']} | {rec['thresholds'] or '-'} | "
            f"{rep['tpot_ms']['p50']:.2f} / {sim['tpot_ms']:.2f} | "
            f"{rep['e2e_s']['p50']:.2f} / {sim['e2e_ms'] / 1e3:.2f} | "
            f"{rep['queued_ms']['p50']:.0f} / {rep['queued_ms']['p99']:.0f} against {sim['queued_ms']:.0f} / "
            f"{sim['queued_p99']:.0f} | {arrival['p50']:.2f} / {sim['from_arrival_ms'] / 1e3:.2f} ({arrival['p99']:.2f} "
            f"/ {sim['from_arrival_p99'] / 1e3:.2f}) | {sim['backlog']} |"
        )


if __name__ == "__main__":
    main()
