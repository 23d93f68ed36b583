"""Does delayed batching help latency at an offered load? Run 159's TokenRouter row (p = 0.1, at most 8 in
flight) simulated as an open loop on its own step times and hop delays (`bench/matrix.py`'s
`open_loop_simulation`), at its served thresholds (3, 4) and at others, at 4 and 5 requests/s (forty-second
session). The step times were measured at (3, 4); other thresholds run other batch sizes, priced from the
same measurements (by state where the run measured latencies alone).

Usage: python3 docs/raw/offline-42/thresholds_at_a_rate.py docs/raw/run-a14/call5/run159/results-*.tar.gz
"""

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "matrix", Path(__file__).resolve().parents[3] / "bench" / "matrix.py"
)
matrix = importlib.util.module_from_spec(spec)
sys.modules["matrix"] = matrix
spec.loader.exec_module(matrix)

(rec,) = [r for r in matrix.load_records(sys.argv[1:]) if r["mode"] == "tokenrouter"]
for rate in (4.0, 5.0):
    for b in ({"slm": 1, "llm": 1}, {"slm": 1, "llm": 2}, {"slm": 2, "llm": 4}, {"slm": 3, "llm": 4}):
        s = matrix.open_loop_simulation(rec | {"thresholds": b}, rate)
        print(
            f"{rate:g} requests/s, B = ({b['slm']}, {b['llm']}): TPOT p50 {s['tpot_ms']['p50']:.2f} ms, from arrival "
            f"p50 / p99 {s['from_arrival_ms']['p50'] / 1e3:.2f} / {s['from_arrival_ms']['p99'] / 1e3:.2f} s, queued "
            f"at the cap p99 {s['queued_ms']['p99']:.0f} ms, backlog at the end {s['backlog']}"
        )
