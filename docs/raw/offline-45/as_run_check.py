"""How near the simulator comes to each served closed-loop row when it is given everything the row measured.

For every closed-loop TokenRouter and eager row whose servers counted hop delays and host gaps (run 68 on):
measured tok/s over the simulation of the row as it ran (`bench/matrix.py`'s `run_simulation`: its own step times,
its requests each with its own routing, its max delay; three seeds) with its hops' measured delay
(`run_hop_simulation`), and with its host gaps as well (`run_gap_simulation`).

    python3 docs/raw/offline-45/as_run_check.py docs/raw/run-a*/call*/run*/results-*.tar.gz
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import matrix  # noqa: E402


def spread(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=20)
    return (f"mean {statistics.mean(xs):.3f}, sd {statistics.pstdev(xs):.3f}, {min(xs):.3f} to {max(xs):.3f} "
            f"(5-95 %: {q[0]:.3f} to {q[-1]:.3f})")  # fmt: skip


def main(paths: list[str]) -> None:
    hops, both = [], []
    print("| run | mode | B | N | measured | / with hops | / with hops and gaps |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for path in sorted(paths):
        for rec in matrix.load_records([path]):
            if rec["mode"] not in ("tokenrouter", "eager") or rec.get("request_rate"):
                continue
            h, g = matrix.run_hop_simulation(rec), matrix.run_gap_simulation(rec)
            if h is None or g is None:
                continue
            measured = rec["report"]["decode_throughput_tok_s"]
            hops.append(measured / h)
            both.append(measured / g)
            b = matrix.threshold_label(rec.get("thresholds") or {})
            print(f"| {Path(path).parent.name} | {rec['mode']} | {b} | {rec['n']} | {measured:.0f} | "
                  f"{measured / h:.3f} | {measured / g:.3f} |", flush=True)  # fmt: skip
    print(f"\n{len(hops)} rows, measured over the simulation as the run was")
    print(f"with its hops' delay: {spread(hops)}")
    print(f"with its hops' delay and host gaps: {spread(both)}")


if __name__ == "__main__":
    main(sys.argv[1:])
