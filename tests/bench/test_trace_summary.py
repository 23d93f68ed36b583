"""bench/trace_summary.py: a live profile's steps, phases, loop gaps and GPU busy time, from a trace."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("trace_summary", ROOT / "bench" / "trace_summary.py")
trace_summary = importlib.util.module_from_spec(spec)
sys.modules["trace_summary"] = trace_summary
spec.loader.exec_module(trace_summary)


def region(phase: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"tokenrouter.{phase}", "ts": ts, "dur": dur}


def kernel(ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": "gemm", "ts": ts, "dur": dur}


def test_steps_phases_gaps_and_the_union_of_kernels(tmp_path, capsys):
    # two steps 1,000 us apart: forward 400 us, route 100, commit 50; kernels overlapping within each step
    events = []
    for start in (0.0, 1000.0):
        events += [region("forward", start, 400.0), region("route", start + 400.0, 100.0),
                   region("commit", start + 500.0, 50.0), kernel(start + 10.0, 200.0),
                   kernel(start + 100.0, 200.0), kernel(start + 420.0, 30.0)]  # fmt: skip
    s = trace_summary.summarize(events)
    assert s["steps"] == 2 and s["gpu"] and s["window_ms"] == 1.0
    assert (s["host_ms"], s["forward_ms"], s["route_ms"], s["commit_ms"]) == (0.55, 0.4, 0.1, 0.05)
    assert s["gap_ms"] == 0.45  # the first step's end to the second's start; the last has no next
    assert s["gpu_busy_ms"] == 0.32 and s["kernels_per_step"] == 3  # 10-300 us and 420-450 us
    path = tmp_path / "t.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert trace_summary.main([str(path), "--json", str(tmp_path / "s.json")]) == 0
    assert (
        "| t.trace.json | 2 | 0.550 | 0.400 | 0.100 | 0.050 | 0.450 / 0.450 | 0.320 | 3 |"
        in capsys.readouterr().out
    )
    assert json.loads((tmp_path / "s.json").read_text())["t.trace.json"]["steps"] == 2
    assert s["top_kernels"] == [["gemm", 0.43]]  # (200 + 200 + 30) us a step, summed, not the union
    assert trace_summary.main([str(path), "--kernels", "3"]) == 0
    assert (
        "t.trace.json: the kernels of most GPU time (ms per step)\n     0.430  gemm"
        in capsys.readouterr().out
    )
    assert trace_summary.summarize([kernel(0.0, 5.0)]) == {"steps": 0}


def test_a_file_that_is_not_a_trace_is_an_error(tmp_path, capsys):
    (tmp_path / "x.json").write_text("not json")
    assert trace_summary.main([str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'x.json'}: ")
