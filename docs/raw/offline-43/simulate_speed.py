"""The simulator before and after its rows were routed at once (forty-third session), side by side in one process:
the same seeded runs, their results compared, their times printed as a table.

    python3 docs/raw/offline-43/simulate_speed.py [REV]   # REV: the code to compare with (default 47ee4ac)
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tokenrouter.compiler.throughput import simulate as new
from tokenrouter.compiler.throughput.inputs import StepLatency, make_inputs

rev = sys.argv[1] if len(sys.argv) > 1 else "47ee4ac"
src = subprocess.run(
    ["git", "show", f"{rev}:tokenrouter/compiler/throughput/simulate.py"],
    capture_output=True,
    text=True,
    check=True,
).stdout
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(src)
spec = importlib.util.spec_from_file_location("simulate_old", f.name)
old = importlib.util.module_from_spec(spec)
sys.modules["simulate_old"] = old  # dataclasses look their module up
spec.loader.exec_module(old)
Path(f.name).unlink()


def inputs(n: int):
    step = {
        "slm": StepLatency(((1, 1.0), (8, 1.3), (64, 2.5), (512, 8.0))),
        "llm": StepLatency(((1, 5.0), (8, 5.5), (64, 9.0), (512, 30.0))),
    }
    return make_inputs(["slm", "llm"], step, [[0.9, 0.1], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]], n)


RUNS = [  # (N, what, SimConfig's settings)
    (8, "endless", dict(horizon_ms=60_000.0)),
    (
        8,
        "512 tokens, hops",
        dict(horizon_ms=60_000.0, request_tokens=512, max_delay_ms=20.0, hop_ms=(0.3, 0.3)),
    ),
    (256, "endless", dict(horizon_ms=60_000.0)),
    (
        256,
        "512 tokens, hops",
        dict(horizon_ms=60_000.0, request_tokens=512, max_delay_ms=20.0, hop_ms=(0.3, 0.3)),
    ),
    (1024, "endless", dict(horizon_ms=60_000.0)),
    (
        1024,
        "512 tokens, hops",
        dict(horizon_ms=60_000.0, request_tokens=512, max_delay_ms=20.0, hop_ms=(0.3, 0.3)),
    ),
]
print(f"| N | run | before ({rev}) s | after s | after / before | same result |")
print("| ---: | --- | ---: | ---: | ---: | --- |")
for n, what, kw in RUNS:
    sys_in, times, results = inputs(n), [], []
    for mod in (old, new):
        t0 = time.perf_counter()
        res = mod.simulate(sys_in, mod.SimConfig((2, 3), **kw))
        times.append(time.perf_counter() - t0)
        results.append(res.as_dict(sys_in.models))
    same = "yes" if results[0] == results[1] else "NO"
    print(f"| {n} | {what} | {times[0]:.2f} | {times[1]:.2f} | {times[1] / times[0]:.2f} | {same} |")
