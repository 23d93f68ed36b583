"""`LiveProfiler`: a subserver's torch.profiler, driven by `Profile` messages (the HTTP side is in
tests/runtime/frontend/test_http_api.py)."""

from __future__ import annotations

import json

import torch

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.subserver import profiling
from tokenrouter.runtime.subserver.profiling import LiveProfiler, region


def _work() -> None:
    with region("forward"):
        torch.ones(64, 64) @ torch.ones(64, 64)


def test_a_profile_marks_the_regions_only_while_it_runs(tmp_path):
    prof = LiveProfiler("slm", "cpu")
    assert isinstance(region("forward"), type(profiling.contextlib.nullcontext()))
    assert prof.handle(m.Profile(model="slm", start=True)) == m.ProfileDone(model="slm", start=True)
    assert prof.running and not isinstance(region("forward"), type(profiling.contextlib.nullcontext()))
    _work()
    done = prof.handle(m.Profile(model="slm", start=False, out_dir=str(tmp_path / "p")))
    assert done.error is None and not prof.running
    trace, table = done.files
    assert trace.endswith(".trace.json") and "-slm-" in trace and table.endswith(".ops.txt")
    names = {e.get("name") for e in json.loads(open(trace).read())["traceEvents"]}
    assert "tokenrouter.forward" in names and "aten::mm" in names
    assert isinstance(region("forward"), type(profiling.contextlib.nullcontext()))
    # a repeated stop (the lockstep process gets one per model) answers with the same files
    assert prof.handle(m.Profile(model="llm", start=False, out_dir=str(tmp_path / "p"))).files == done.files


def test_a_stop_without_a_profile_is_an_error_and_a_discarded_one_writes_nothing(tmp_path):
    prof = LiveProfiler("slm", "cpu")
    assert prof.handle(m.Profile(model="slm", start=False, out_dir=str(tmp_path))).error == (
        "RuntimeError: no profile is running"
    )
    prof.handle(m.Profile(model="slm", start=True))
    _work()
    assert prof.handle(m.Profile(model="slm", start=False)).files == []  # out_dir "": discarded
    assert list(tmp_path.iterdir()) == [] and not prof.running and not profiling._active
