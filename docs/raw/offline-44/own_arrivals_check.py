"""Each open-loop row of runs 155, 156, 159, 162, 163 and 166 simulated on its own arrival times (forty-fourth
session: `SimConfig.arrivals_ms`, `bench/matrix.py`'s `open_loop_simulation(own_arrivals=True)`, `tokenrouter
simulate --arrivals`), on its own step times, thresholds, hop delays and max delay, three seeds of routing, every
request measured: the latencies set side by side with what the row measured. The Poisson runs of 600 s
(`openloop_check.py`) meet bursts that a served row of 48-96 requests seldom does; on the row's own arrivals the
two see the same load. "with gaps": each step also takes its model's measured host gap between back-to-back
steps (`SimConfig.gap_ms`, `tokenrouter_step_gap_seconds_total`).

Usage: python3 docs/raw/offline-44/own_arrivals_check.py docs/raw/run-a14/call{1,2,5}/run*/results-*.tar.gz \
    docs/raw/run-a15/call{2,3,6}/run*/results-*.tar.gz
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("matrix", ROOT / "bench" / "matrix.py")
matrix = importlib.util.module_from_spec(spec)
sys.modules["matrix"] = matrix
spec.loader.exec_module(matrix)

print(
    "| run | req/s | mode | B | requests | TPOT p50 ms: measured / simulated / with gaps | from arrival p50 s: measured "
    "/ simulated / with gaps | from arrival p99 s: measured / simulated / with gaps |"
)
print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |")
for tarball in sys.argv[1:]:
    run = Path(tarball).parent.name
    for rec in matrix.load_records([tarball]):
        if not rec.get("request_rate"):
            continue
        sim = matrix.open_loop_simulation(rec, own_arrivals=True)
        if sim is None:
            continue
        gap = matrix.open_loop_simulation(rec, own_arrivals=True, gaps=True)
        rep = rec["report"]
        ok = [r for r in rep["per_request"] if r["ok"]]
        # as the load generator reports it (linear percentiles), for runs before it did too
        arrival = np.array([r["queued_s"] + r["e2e_s"] for r in ok])
        mid, top = np.percentile(arrival, 50), np.percentile(arrival, 99)
        b = rec.get("thresholds") or {}
        print(
            f"| {run} | {rec['request_rate']:g} | {rec['mode']} | {tuple(b.values()) if b else '-'} | {len(ok)} | "
            f"{rep['tpot_ms']['p50']:.2f} / {sim['tpot_ms']['p50']:.2f} / {gap['tpot_ms']['p50']:.2f} | {mid:.2f} / "
            f"{sim['from_arrival_ms']['p50'] / 1e3:.2f} / {gap['from_arrival_ms']['p50'] / 1e3:.2f} | {top:.2f} / "
            f"{sim['from_arrival_ms']['p99'] / 1e3:.2f} / {gap['from_arrival_ms']['p99'] / 1e3:.2f} |"
        )
