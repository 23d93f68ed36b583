"""How far each row of run 159 goes: its simulation (`bench/matrix.py`'s `open_loop_simulation`: the row's own
step times, thresholds and hop delays, three seeds of 600 s) at other offered rates. Step times at batch sizes
the run did not measure are held at the largest measured (forty-second session).

Usage: python3 docs/raw/offline-42/capacity.py docs/raw/run-a14/call5/run159/results-*.tar.gz
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

for rec in matrix.load_records(sys.argv[1:]):
    for rate in (4.0, 5.0, 6.0) if rec["mode"] == "tokenrouter" else (2.5, 2.8):
        s = matrix.open_loop_simulation(rec, rate)
        print(
            f"{rec['mode']} at {rate:g} requests/s: TPOT p50 {s['tpot_ms']['p50']:.2f} ms, E2E p50 "
            f"{s['e2e_ms']['p50'] / 1e3:.2f} s, queued at the cap p50 / p99 {s['queued_ms']['p50']:.0f} / "
            f"{s['queued_ms']['p99']:.0f} ms, backlog at the end {s['backlog']}"
        )
