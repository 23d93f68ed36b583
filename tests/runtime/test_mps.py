"""CUDA MPS for subservers sharing a GPU (runtime/mps.py): placement, a private daemon's life, serve's flag."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tokenrouter.runtime.mps import CONTROL, MpsDaemon, shared_gpus

ROOT = Path(__file__).resolve().parents[2]


def test_shared_gpus_counts_first_gpu_of_local_models():
    plan = {"models": {"a": {"gpus": [0]}, "b": {}, "c": {"gpus": [1, 2]}, "d": {"gpus": [1]}}}
    assert shared_gpus(plan, ["a", "b", "c", "d"]) == [0, 1]
    assert shared_gpus(plan, ["a", "c"]) == []


def test_a_tensor_parallel_model_shares_each_of_its_gpus():
    plan = {"models": {"slm": {"gpus": [1]}, "llm": {"gpus": [0, 1]}}}
    assert shared_gpus(plan, ["slm", "llm"]) == [1]


def fake_control(tmp_path: Path, rc: int = 0) -> Path:
    """A stand-in `nvidia-cuda-mps-control` that logs its argv, stdin and pipe folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / CONTROL
    exe.write_text(f'#!/bin/sh\necho "$@|$CUDA_MPS_PIPE_DIRECTORY|$(cat -)" >> {tmp_path}/calls\nexit {rc}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_daemon_starts_exports_and_quits(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_control(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    d = MpsDaemon(tmp_path / "run")
    assert d.start() is None
    assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "run" / "mps" / "pipe")
    d.stop()
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    calls = (tmp_path / "calls").read_text().splitlines()
    pipe = str(tmp_path / "run" / "mps" / "pipe")
    assert calls[0].startswith(f"-d|{pipe}|") and calls[1] == f"|{pipe}|quit"


def test_daemon_failure_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_control(tmp_path, rc=3)}{os.pathsep}{os.environ['PATH']}")
    d = MpsDaemon(tmp_path / "run")
    assert "exited 3" in d.start()
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert MpsDaemon(tmp_path / "run2").start() == f"{CONTROL} is not installed"


# `serve` on CPU, as far as argument checking goes (every case below is refused before a model loads)
SERVE_CPU = [
    sys.executable,
    "-m",
    "tokenrouter.cli",
    "serve",
    "examples/bernoulli.tr",
    "--port",
    "0",
    "--device",
    "cpu",
]


def test_serve_mps_flag_errors(tmp_path):
    cli = SERVE_CPU
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}"}  # no nvidia-cuda-mps-control here
    r = subprocess.run([*cli, "--mps", "sometimes"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--mps sometimes: expected one of auto, on, off" in r.stderr
    r = subprocess.run([*cli, "--mps", "on"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 1 and f"--mps on: {CONTROL} is not installed" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_serve_mps_sm_usage_errors():
    cli = SERVE_CPU
    for args, msg in (
        (["--mps-sm", "llm"], "bad --mps-sm 'llm': expected MODEL=PERCENT"),
        (["--mps-sm", "llm=150"], "--mps-sm llm=150: a percentage from 1 to 100"),
        (["--mps", "off", "--mps-sm", "llm=50"], "--mps-sm needs MPS (not --mps off)"),
        (["--mps", "off", "--mps-low", "llm"], "--mps-low needs MPS (not --mps off)"),
    ):
        r = subprocess.run([*cli, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_child_env_sets_the_active_thread_percentage():
    from tokenrouter.runtime.launcher import Launcher, ServeConfig

    launcher = Launcher(ServeConfig(plan="x.plan", mps_sm={"llm": 70}))
    assert launcher._child_env("llm") == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "70"}
    assert launcher._child_env("slm") == {}


def test_child_env_lowers_the_client_priority():
    from tokenrouter.runtime.launcher import Launcher, ServeConfig

    launcher = Launcher(ServeConfig(plan="x.plan", mps_sm={"llm": 70}, mps_low=["llm"]))
    assert launcher._child_env("llm") == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "70",
        "CUDA_MPS_CLIENT_PRIORITY": "1",
    }
    assert launcher._child_env("slm") == {}
