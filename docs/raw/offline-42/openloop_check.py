"""The simulator's open loop (`SimConfig.arrival_rate_per_s`, `tokenrouter simulate --request-rate`) against runs
155, 156 and 159 (forty-second session): each served row simulated on its own measured step times, thresholds,
hop delays and max delay, at its offered rate and cap (`bench/matrix.py`'s `open_loop_simulation`: three seeds,
600 s after a 10 s warm-up), and the latencies set side by side with the measured. `--report` of an open loop's
results gives the same table since the forty-second session.

Usage: python3 docs/raw/offline-42/openloop_check.py docs/raw/run-a14/call{1,2,5}/run*/results-*.tar.gz
"""

import importlib.util
import sys
from pathlib import Path

from tokenrouter.runtime.loadgen import _spread

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("matrix", ROOT / "bench" / "matrix.py")
matrix = importlib.util.module_from_spec(spec)
sys.modules["matrix"] = matrix
spec.loader.exec_module(matrix)


def main() -> None:
    print(
        "| offered req/s | mode | B | TPOT p50 ms: measured / simulated | E2E p50 s | queued at the cap p50 / p99 ms "
        "| from arrival to end p50 s (p99) | backlog at the end, simulated |"
    )
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for rec in matrix.load_records(sys.argv[1:]):
        rep, sim = rec["report"], matrix.open_loop_simulation(rec)
        arrival = _spread([r["queued_s"] + r["e2e_s"] for r in rep["per_request"] if r["ok"]])
        print(
            f"| {rec['request_rate']:g} | {rec['mode']} | {rec['thresholds'] or '-'} | "
            f"{rep['tpot_ms']['p50']:.2f} / {sim['tpot_ms']['p50']:.2f} | "
            f"{rep['e2e_s']['p50']:.2f} / {sim['e2e_ms']['p50'] / 1e3:.2f} | "
            f"{rep['queued_ms']['p50']:.0f} / {rep['queued_ms']['p99']:.0f} against {sim['queued_ms']['p50']:.0f} / "
            f"{sim['queued_ms']['p99']:.0f} | {arrival['p50']:.2f} / {sim['from_arrival_ms']['p50'] / 1e3:.2f} "
            f"({arrival['p99']:.2f} / {sim['from_arrival_ms']['p99'] / 1e3:.2f}) | {sim['backlog']} |"
        )


if __name__ == "__main__":
    main()
