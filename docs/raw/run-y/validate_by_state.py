"""Offline: the chain with contention by state on runs 52-58's eager profiles, against what was served.
Run from the repository root after extracting each run's results tarball under /tmp/rr/runNN/ (tar xzf
docs/raw/run-y/callN/runNN/results-*.tar.gz -C /tmp/rr/runNN). The 0.6B's latencies alone are another run's served
(1, 5) at 4-8 rows (the 8B then holds 4 or fewer and waits), flat below 4 rows."""

import dataclasses
import glob
import json
import sys

from tokenrouter.compiler.plan import read_plan
from tokenrouter.compiler.throughput.dtmc import analyze
from tokenrouter.compiler.throughput.plan_inputs import system_from_plan
from tokenrouter.compiler.throughput.profile_format import read_profile

sys.path.insert(0, "/work/main/bench")
import importlib.util

spec = importlib.util.spec_from_file_location("matrix", "/work/main/bench/matrix.py")
matrix = importlib.util.module_from_spec(spec)
sys.modules["matrix"] = matrix
spec.loader.exec_module(matrix)


def alone_from(record_path, from_b):
    """The 0.6B's latencies in a served (1, B) run at b >= from_b (the 8B then holds fewer than B: idle), flat below."""
    prof = matrix.record_profile(json.load(open(record_path)))
    pts = {b: ms for b, ms in prof.step_ms["slm"].points if b >= from_b}
    lo = pts[min(pts)]
    return {"slm": {**{b: lo for b in range(1, min(pts))}, **pts}}


def predict(run_dir, alone_src, from_b):
    raw = glob.glob(run_dir + "/*/")[0]
    plan = read_plan(
        glob.glob(raw + "0.6b+8b-bern*.plan")[0]
        if False
        else [p for p in glob.glob(raw + "*.plan") if "-n8" not in p][0]
    )
    eager = read_profile(raw + "profile-n8.json")
    from tokenrouter.compiler.throughput.inputs import StepLatency

    lone = alone_from(alone_src, from_b)
    prof = dataclasses.replace(eager, alone_ms={m: StepLatency(tuple(v.items())) for m, v in lone.items()})
    state = system_from_plan(plan, 8, profile=prof).inputs
    plain = system_from_plan(plan, 8, profile=eager).inputs
    return {b: (analyze(state, (1, b)).throughput, analyze(plain, (1, b)).throughput) for b in range(1, 9)}


if __name__ == "__main__":
    rr = "/tmp/rr"
    served = {}
    for rec in glob.glob(rr + "/run5*/*/record-*-n8*.json"):
        r = json.load(open(rec))
        run = rec.split("/")[3]
        b = 1 if r["mode"] == "eager" else r["thresholds"]["llm"]
        if r["mode"] == "eager" or r["thresholds"]["slm"] == 1:
            served.setdefault(run, {}).setdefault(b, []).append(r["report"]["decode_throughput_tok_s"])
    for run, src, fb in (
        ("run53", "run52", 4),
        ("run52", "run53", 4),
        ("run55", "run56", 4),
        ("run56", "run57", 4),
        ("run57", "run58", 4),
        ("run58", "run55", 4),
    ):
        pred = predict(f"{rr}/{run}", glob.glob(f"{rr}/{src}/*/record-tokenrouter-n8-B1-5.json")[0], fb)
        best = max(pred, key=lambda b: pred[b][0])
        best0 = max(pred, key=lambda b: pred[b][1])
        print(f"{run} (alone from {src}'s (1, 5)): chain with alone chooses (1, {best}), plain (1, {best0})")
        for b, vals in sorted(served[run].items()):
            for v in vals:
                print(
                    f"   (1, {b}) served {v:7.1f}  alone-chain {pred[b][0]:7.0f} ({v / pred[b][0]:.2f}x)  plain {pred[b][1]:7.0f} ({v / pred[b][1]:.2f}x)"
                )


def full_search(run_dir, alone_src):
    """The thresholds `tune` chooses over both models (not only B_slm = 1), by state."""
    import dataclasses

    from tokenrouter.compiler.throughput.inputs import StepLatency
    from tokenrouter.compiler.throughput.optimize import tune

    raw = glob.glob(run_dir + "/*/")[0]
    plan = read_plan([p for p in glob.glob(raw + "*.plan") if "-n8" not in p][0])
    eager = read_profile(raw + "profile-n8.json")
    lone = alone_from(alone_src, 4)
    prof = dataclasses.replace(eager, alone_ms={m: StepLatency(tuple(v.items())) for m, v in lone.items()})
    res = tune(system_from_plan(plan, 8, profile=prof).inputs)
    return res.best.thresholds, res.best.throughput


if __name__ == "__main__":
    for run, src in (("run53", "run52"), ("run52", "run53"), ("run55", "run56"), ("run56", "run57"),
                     ("run57", "run58"), ("run58", "run55")):  # fmt: skip
        b, t = full_search(f"/tmp/rr/{run}", glob.glob(f"/tmp/rr/{src}/*/record-tokenrouter-n8-B1-5.json")[0])
        print(f"{run}: the full search by state chooses {b} ({t:.0f} tok/s predicted)")
