"""Offline: what `tune` by state would choose on runs 59-65's eager profiles had the busy board measured the
0.6B's latencies alone as the step counters now do (no 8B step overlapping), against what was served.

The old board's `alone_ms` in these profiles are dropped (its "alone" steps were mostly overlapped: see
docs/throughput.md, "Contention by state"). In their place, the 0.6B's latencies alone are another run's served
steps at FROM rows or more, where that run's 8B, at its threshold, holds too few requests to start (flat below
FROM rows). Run from the repository root after extracting each run's results tarball under /tmp/rr/runNN/
(`tar xzf docs/raw/run-z/callN/runNN/results-*.tar.gz -C /tmp/rr/runNN`)."""

import dataclasses
import glob
import importlib.util
import json
import sys

from tokenrouter.compiler.plan import read_plan
from tokenrouter.compiler.throughput.dtmc import analyze
from tokenrouter.compiler.throughput.inputs import StepLatency
from tokenrouter.compiler.throughput.optimize import tune
from tokenrouter.compiler.throughput.plan_inputs import system_from_plan
from tokenrouter.compiler.throughput.profile_format import read_profile

spec = importlib.util.spec_from_file_location("matrix", "bench/matrix.py")
matrix = importlib.util.module_from_spec(spec)
sys.modules["matrix"] = matrix
spec.loader.exec_module(matrix)

RR = "/tmp/rr"
# run -> (source run, the source's served thresholds (slm, llm), FROM rows: 8 - (B_llm - 1))
CASES = {
    "run59": ("run61", (2, 5), 4),
    "run61": ("run63", (2, 5), 4),
    "run63": ("run65", (2, 6), 3),
    "run65": ("run59", (2, 5), 4),
    "run60": ("run64", (2, 4), 5),
    "run62": ("run60", (1, 5), 4),
    "run64": ("run60", (1, 5), 4),
}


def served(run):
    """(slm, llm) -> tok/s of every TokenRouter row served in `run` (eager as (1, 1))."""
    out = {}
    for rec in glob.glob(f"{RR}/{run}/*/record-*-n8*.json"):
        r = json.load(open(rec))
        b = (1, 1) if r["mode"] == "eager" else (r["thresholds"]["slm"], r["thresholds"]["llm"])
        out.setdefault(b, []).append(r["report"]["decode_throughput_tok_s"])
    return out


def alone_from(run, b, from_rows):
    rec = glob.glob(f"{RR}/{run}/*/record-tokenrouter-n8-B{b[0]}-{b[1]}.json")[0]
    prof = matrix.record_profile(json.load(open(rec)))
    pts = {n: ms for n, ms in prof.step_ms["slm"].points if n >= from_rows}
    return StepLatency(tuple(pts.items()))  # flat below its first point


def inputs(run, alone):
    raw = glob.glob(f"{RR}/{run}/*/")[0]
    plan = read_plan([p for p in glob.glob(raw + "*.plan") if "-n8" not in p][0])
    eager = read_profile(raw + "profile-n8.json")
    prof = dataclasses.replace(eager, alone_ms={"slm": alone})
    return system_from_plan(plan, 8, profile=prof).inputs


if __name__ == "__main__":
    for run, (src, b, rows) in CASES.items():
        inp = inputs(run, alone_from(src, b, rows))
        res = tune(inp)
        print(f"{run} (0.6B alone from {src}'s {b} at >= {rows} rows): tune by state chooses "
              f"{tuple(res.best.thresholds)}, {res.best.throughput:.0f} tok/s predicted")  # fmt: skip
        for th, vals in sorted(served(run).items()):
            pred = analyze(inp, th).throughput
            tps = " / ".join(f"{v:.1f}" for v in vals)
            print(f"   {th} served {tps}  predicted {pred:.0f}  ({sum(vals) / len(vals) / pred:.2f}x)")


def alone_scaled(run, at8):
    """What `profile --from-metrics` makes of an eager profile whose 0.6B ran alone only at 8 rows (the 8B holding
    no request), taking `at8` ms there: the latencies beside, scaled by at8 over the latency beside at 8 rows."""
    raw = glob.glob(f"{RR}/{run}/*/")[0]
    beside = read_profile(raw + "profile-n8.json").beside_ms["slm"]
    ratio = at8 / beside.at(8)
    return StepLatency(tuple((b, ms * ratio) for b, ms in beside.points)), ratio


if __name__ == "__main__":
    print(
        "\nThe 0.6B alone only at 8 rows, at the source run's served latency there (the eager profiles' case):"
    )
    for run, (src, b, rows) in CASES.items():
        at8 = alone_from(src, b, rows).at(8)
        scaled, ratio = alone_scaled(run, at8)
        res = tune(inputs(run, scaled))
        print(f"{run}: {at8:.2f} ms at 8 rows, ratio {ratio:.2f}: tune by state chooses "
              f"{tuple(res.best.thresholds)}, {res.best.throughput:.0f} tok/s predicted")  # fmt: skip
