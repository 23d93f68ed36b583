"""Each subserver's torch threads: the usable cores divided among the plan's models, on CPU and on GPU
(torch's default, one thread per core in every process, oversubscribes the cores as soon as two subservers
share a host: on a 16-core GPU machine, a parallel `torch.cat` that took 0.05 ms in one process took 8 ms in
each of two 16-thread processes at once); `cpu_threads` overrides."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tokenrouter.runtime.subserver import process
from tokenrouter.runtime.subserver.process import Subserver, threads_per_subserver


@pytest.mark.parametrize(
    ("models", "cores", "threads"), [(2, 16, 8), (3, 16, 5), (1, 2, 2), (3, 2, 1), (8, 4, 1)]
)
def test_the_cores_are_divided_among_the_models(models, cores, threads):
    assert threads_per_subserver(models, cores=cores) == threads


def test_the_cores_are_the_processs_affinity(monkeypatch):
    monkeypatch.setattr(process.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.setattr(process.os, "cpu_count", lambda: 64)
    assert threads_per_subserver(2) == 3


def test_no_models_is_refused():
    with pytest.raises(ValueError, match="models must be >= 1"):
        threads_per_subserver(0, cores=4)


@pytest.mark.parametrize(
    ("device", "cpu_threads", "expected"), [("cuda:0", None, 8), ("cpu", None, 8), ("cuda:0", 3, 3)]
)
def test_a_subserver_sets_its_threads_on_any_device(monkeypatch, device, cpu_threads, expected):
    calls = []
    monkeypatch.setattr(process, "usable_cores", lambda: 16)
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    fake = SimpleNamespace(
        args=SimpleNamespace(cpu_threads=cpu_threads),
        plan={"models": {"slm": {}, "llm": {}}},
        device=device,
        model="slm",
    )
    Subserver.init_threads_per_process(fake)
    assert calls == [expected]
