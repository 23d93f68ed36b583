"""Each TokenRouter and eager row of the given archives, checked on its own step times with its prompt prefills
left in their batch sizes' latencies (as before the fortieth session) and priced apart (`from_metrics`): the
DTMC's throughput and the simulation of the run as it was with its hops' measured delay, each against the
measured throughput. Rows whose servers did not count steps by shape (before the thirty-fifth session) are
the same both ways and are left out.

    python3 docs/raw/offline-40/prefillcheck.py docs/raw/run-a*/call*/run*/results-*.tar.gz
"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import matrix as mx  # noqa: E402


def checks(rec: dict, keep: bool) -> tuple[float | None, float | None]:
    mx.KEEP_PREFILLS = keep
    return mx.run_prediction(rec), mx.run_hop_simulation(rec)


def main(paths: list[str]) -> None:
    print("| run | mode | N | prompt | B | tok/s | prefill steps (slm / llm) | DTMC kept | DTMC apart | "
          "sim kept | sim apart |")  # fmt: skip
    print("| --- | --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for path in paths:
        run = re.search(r"run(\d+)", path)
        for r in mx.load_records([path]):
            if r["mode"] not in ("tokenrouter", "eager"):
                continue
            if not any("by_shape" in k for k in r.get("metrics_after") or {}):
                continue
            mx.KEEP_PREFILLS = False
            prof = mx.record_profile(r)
            if prof is None:
                continue
            tok = r["report"]["decode_throughput_tok_s"]
            (dk, sk), (da, sa) = checks(r, True), checks(r, False)

            def cell(x: float | None, tok: float = tok) -> str:
                return f"{x:.1f} ({tok / x:.2f})" if x else "-"

            pre = " / ".join(str(prof.prefill.get(m, {}).get("steps", 0)) for m in ("slm", "llm"))
            print(f"| {run.group(1) if run else '?'} | {mx.mode_label(r)} | {r['n']} | {r.get('prompt_len', 32)} | "
                  f"{mx.threshold_label(r['thresholds'] or {})} | {tok:.1f} | {pre} | {cell(dk)} | {cell(da)} | "
                  f"{cell(sk)} | {cell(sa)} |")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
