"""Torch threads for in-process commands (`runtime.threads`) and the progress lines of long steps."""

from __future__ import annotations

import io

import pytest

from tokenrouter import progress
from tokenrouter.runtime import threads


def test_the_cores_are_the_affinity_within_a_cgroup_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("250000 100000\n")  # a container of 2.5 CPUs
    assert threads.usable_cores(cpu_max) == 3
    cpu_max.write_text("max 100000\n")
    assert threads.usable_cores(cpu_max) == 16
    assert threads.usable_cores(tmp_path / "absent") == 16


def test_set_torch_threads_splits_the_cores_and_keeps_omp_num_threads(monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.set_torch_threads(2) == 4 and calls == [4]
    assert threads.set_torch_threads(3, threads=5) == 5 and calls == [4, 5]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.set_torch_threads(2) == torch.get_num_threads() and calls == [4, 5]
    with pytest.raises(ValueError, match="models must be >= 1"):
        threads.threads_per_model(0, cores=4)


def test_the_in_process_commands_set_their_threads(monkeypatch, capsys):
    """generate (a model folder, a plan), train-router and eval (teacher forcing), profile: one helper."""
    from pathlib import Path

    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.runtime.engine.generate import generate_from_folder
    from tokenrouter.runtime.offline import load_offline
    from tokenrouter.runtime.sampling import SamplingParams
    from tokenrouter.throughput.profile import ProfileConfig, run_profile
    from tokenrouter.training.teacher import load_engines

    models = Path(__file__).resolve().parents[1] / "examples" / "models"
    asked = []
    monkeypatch.setattr(threads, "set_torch_threads", asked.append)
    generate_from_folder(
        str(models / "tiny-small"),
        prompt=None,
        prompt_ids=[1, 2, 3],
        params=SamplingParams(temperature=0.0, max_tokens=2),
    )
    defines = {"slm_path": str(models / "tiny-small"), "llm_path": str(models / "tiny-large")}
    plan = compile_file(Path(threads.__file__).parents[1] / "stdlib" / "bernoulli.tr", defines).plan
    load_offline(plan, "cpu")
    load_engines(plan, ["slm"])
    run_profile(
        plan, ProfileConfig(batch_sizes=(1,), prompts=1, max_tokens=2, repeats=1, warmup=0, device="cpu")
    )
    assert asked == [1, 2, 2, 2]
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    run_profile(
        plan, ProfileConfig(batch_sizes=(1,), prompts=1, max_tokens=2, repeats=1, warmup=0, device="cpu")
    )
    lines = [line.split(", ")[0] for line in capsys.readouterr().err.splitlines()]
    assert lines == [
        "profile: 0/2 models timed (timing slm)",
        "profile: 1/2 models timed (timing llm)",
        "profile: 2/2 models timed (1 sample requests)",
        "profile: 2/2 models timed (done)",
    ]


def test_progress_prints_every_few_seconds_and_a_last_line_only_after_one():
    now = [0.0]
    out = io.StringIO()
    quiet = progress.Progress("quick", 3, "steps", out, clock=lambda: now[0])
    quiet.update(1)
    quiet.finish(3)
    assert out.getvalue() == ""
    slow = progress.Progress("teacher forcing", 10, "windows", out, clock=lambda: now[0])
    for done in range(10):
        now[0] += 1.0
        slow.update(done)
    slow.finish(10)
    assert out.getvalue().splitlines() == [
        "teacher forcing: 2/10 windows, 3 s",
        "teacher forcing: 5/10 windows, 6 s",
        "teacher forcing: 8/10 windows, 9 s",
        "teacher forcing: 10/10 windows (done), 10 s",
    ]
