"""How far each row of run 159 goes: its simulation (`openloop_check.simulated`: the row's own step times,
thresholds and hop delays, three seeds of 600 s) at other offered rates. Step times at batch sizes the run did
not measure are held at the largest measured (forty-second session).

Usage: python3 docs/raw/offline-42/capacity.py docs/raw/run-a14/call5/run159/results-*.tar.gz
"""

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("oc", Path(__file__).with_name("openloop_check.py"))
oc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(oc)

for rec in oc.matrix.load_records(sys.argv[1:]):
    for rate in (4.0, 5.0, 6.0) if rec["mode"] == "tokenrouter" else (2.5, 2.8):
        s = oc.simulated(rec | {"request_rate": rate})
        print(
            f"{rec['mode']} at {rate:g} requests/s: TPOT p50 {s['tpot_ms']:.2f} ms, E2E p50 {s['e2e_ms'] / 1e3:.2f} s, "
            f"queued at the cap p50 / p99 {s['queued_ms']:.0f} / {s['queued_p99']:.0f} ms, backlog at the end "
            f"{s['backlog']}"
        )
