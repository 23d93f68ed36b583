"""Where the host gaps change the chain's choice (`bench/retune.py --gaps`), which of the two choices serves faster?

Most of the new choices were never served. Each closed-loop TokenRouter row its run served at that N, where its
servers counted hops and gaps (run 68 on), is simulated as it ran
(`bench/matrix.py`'s `run_simulation`: its own step times, its requests each with its own routing, its hops'
measured delay and its host gaps; five seeds) at the choice without the gaps and at the one with them. The row's own
step times cover the batch sizes it ran; others are held flat beyond the largest (the simulator's rule), so a
choice far from the thresholds the row served is priced less surely.

    python3 docs/raw/offline-45/gap_choice_check.py docs/raw/run-a*/call*/run*/results-*.tar.gz
"""

from __future__ import annotations

import statistics
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import matrix  # noqa: E402
import retune  # noqa: E402


def main(paths: list[str]) -> None:
    ratios = []
    print(
        "| run | N | without gaps | with gaps | row served at | simulated at the choice without / with | with / without |"
    )
    print("| --- | ---: | --- | --- | --- | --- | ---: |")
    for path in sorted(map(Path, paths)):
        try:
            plain, gapped = retune.retune(path), retune.retune(path, gaps=True)
        except (OSError, tarfile.TarError, retune.ArchiveError, retune.MetricsProfileError,
                retune.ThroughputInputError):  # fmt: skip
            continue
        for a, b in zip(plain, gapped, strict=True):
            if a["B"] == b["B"]:
                continue
            recs = [r for r in matrix.load_records([str(path)]) if r["mode"] == "tokenrouter" and r["n"] == a["n"]
                    and not r.get("request_rate")]  # fmt: skip
            for rec in recs:
                at = [dict(zip(a["models"], x, strict=True)) for x in (a["B"], b["B"])]
                old, new = (matrix.run_simulation(rec, seeds=5, hops=True, gaps=True, at=t) for t in at)
                if old is None or new is None:
                    continue
                ratios.append(new / old)
                served = matrix.threshold_label(rec.get("thresholds") or {})
                print(f"| {path.parent.name} | {a['n']} | {a['B']} | {b['B']} | {served} | {old:.0f} / {new:.0f} | "
                      f"{new / old:.3f} |", flush=True)  # fmt: skip
    if ratios:
        print(f"\n{len(ratios)} rows: with / without gaps {min(ratios):.3f} to {max(ratios):.3f}, mean "
              f"{statistics.mean(ratios):.3f}; the choice with the gaps faster in {sum(r > 1 for r in ratios)}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
