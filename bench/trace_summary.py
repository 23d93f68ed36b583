"""Where a subserver's steps go, from the Chrome traces of a live profile (`serve --profile-dir`, then
`POST /start_profile` and `/stop_profile`).

Per trace (one subserver): the steps (`tokenrouter.forward` regions), each phase's host time per step
(`forward`, `route`, `commit`: from the step's first phase to its last), the decode loop's host time between
steps (from a step's end to the next one's start: messages, choosing the batch, waiting for requests), and
on a GPU the kernels' busy time per step (the union of the kernels' intervals that start within the step)
and the kernels launched per step; with `--kernels K`, the K kernels that took the most GPU time, in ms per
step (recorded in the JSON either way: `top_kernels`, the ten first).

Usage: python3 bench/trace_summary.py TRACE.json [TRACE.json ...] [--kernels K] [--json OUT]
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
from pathlib import Path

PHASES = ("forward", "route", "commit")
TOP_KERNELS = 10


def load_events(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def busy_us(spans: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) spans."""
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def summarize(events: list[dict]) -> dict:
    """The trace's figures (ms per step unless named otherwise)."""
    regions = {p: [] for p in PHASES}
    kernels = []
    for e in events:
        if e.get("ph") != "X":
            continue
        name, cat = e.get("name", ""), e.get("cat", "")
        if cat == "user_annotation" and name.startswith("tokenrouter."):
            phase = name.removeprefix("tokenrouter.")
            if phase in regions:
                regions[phase].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))))
        elif cat == "kernel":
            kernels.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), name))
    forwards = sorted(regions["forward"])
    if not forwards:
        return {"steps": 0}
    kernels.sort()
    spans = {p: sorted(regions[p]) for p in PHASES} | {"kernel": [(a, b) for a, b, _ in kernels]}
    starts = {key: [a for a, _ in s] for key, s in spans.items()}

    def within(key: str, lo: float, hi: float) -> list[tuple[float, float]]:
        """The spans of `key` that start in [lo, hi) (each list sorted by start: one bisection each side)."""
        return spans[key][bisect.bisect_left(starts[key], lo) : bisect.bisect_left(starts[key], hi)]

    # a step: from its forward's start to the next forward's start; its phases are the regions within
    bounds = [*(a for a, _ in forwards), float("inf")]
    steps = []
    for i, (start, _) in enumerate(forwards):
        nxt = bounds[i + 1]
        phases = {p: within(p, start, nxt) for p in PHASES}
        end = max(b for found in phases.values() for _, b in found)
        ks = within("kernel", start, nxt)
        steps.append({
            "host_ms": (end - start) / 1e3,
            **{f"{p}_ms": sum(b - a for a, b in phases[p]) / 1e3 for p in PHASES},
            "gap_ms": (nxt - end) / 1e3 if nxt != float("inf") else None,
            "gpu_busy_ms": busy_us(ks) / 1e3,
            "kernels": len(ks),
        })  # fmt: skip

    def mean(key: str) -> float | None:
        values = [s[key] for s in steps if s[key] is not None]
        return statistics.fmean(values) if values else None

    gaps = sorted(s["gap_ms"] for s in steps if s["gap_ms"] is not None)
    by_name: dict[str, float] = {}
    for a, b, name in kernels:
        if forwards[0][0] <= a:  # the kernels of the steps (not of anything before the first)
            by_name[name] = by_name.get(name, 0.0) + (b - a)
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:TOP_KERNELS]
    return {
        "steps": len(steps),
        "window_ms": (bounds[-2] - bounds[0]) / 1e3 if len(forwards) > 1 else None,
        **{key: mean(key) for key in ("host_ms", *(f"{p}_ms" for p in PHASES), "gap_ms", "gpu_busy_ms")},
        "gap_p50_ms": gaps[len(gaps) // 2] if gaps else None,
        "kernels_per_step": mean("kernels"),
        "gpu": bool(kernels),
        # the kernels by their summed duration (not the union), ms per step
        "top_kernels": [[name, us / 1e3 / len(steps)] for name, us in top],
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def table(rows: list[tuple[str, dict]]) -> str:
    out = [
        "| trace | steps | host ms / step | forward | route | commit | loop gap mean / p50 | GPU busy ms / step | "
        "kernels / step |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, s in rows:
        if not s["steps"]:
            out.append(f"| {name} | 0 | - | - | - | - | - | - | - |")
            continue
        gpu = (_ms(s["gpu_busy_ms"]), f"{s['kernels_per_step']:.0f}") if s["gpu"] else ("-", "-")
        out.append(
            f"| {name} | {s['steps']} | {_ms(s['host_ms'])} | {_ms(s['forward_ms'])} | {_ms(s['route_ms'])} | "
            f"{_ms(s['commit_ms'])} | {_ms(s['gap_ms'])} / {_ms(s['gap_p50_ms'])} | {gpu[0]} | {gpu[1]} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument(
        "--kernels", type=int, default=0, metavar="K", help="also list the K kernels of most GPU time"
    )
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args(argv)
    rows = []
    for t in a.traces:
        try:
            rows.append((Path(t).name, summarize(load_events(Path(t)))))
        except (OSError, ValueError, KeyError) as e:
            print(f"error: {t}: {e}", file=sys.stderr)
            return 2
    print(table(rows))
    for name, s in rows if a.kernels > 0 else ():
        print(f"\n{name}: the kernels of most GPU time (ms per step)")
        for kernel, ms in s.get("top_kernels", [])[: a.kernels]:
            print(f"  {ms:8.3f}  {kernel[:120]}")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(rows), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
