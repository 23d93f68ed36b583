"""`serve`'s start and stop: a line per model per phase of its start-up; after SIGINT, SIGTERM or a child's
death the launcher exits promptly and no process it started survives it. (The 2 s target on CPU is measured
by `bench/serve_lifecycle.py`; the bound here is generous.)"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
from multiprocessing.connection import wait
from pathlib import Path

import httpx
import pytest
from frontend_helpers import Server, write_policy

from tokenrouter.runtime.launcher import Launcher, ServeConfig, _child_main

BENCH = str(Path(__file__).resolve().parents[3] / "bench")
sys.path.insert(0, BENCH)
try:  # bench/serve_lifecycle.py: the one reader of a session's processes
    from serve_lifecycle import describe, session_pids
finally:
    sys.path.remove(BENCH)

EXIT_BOUND_S = 5.0


def phase_lines(stderr: str, model: str) -> list[str]:
    prefix = f"tokenrouter: model {model}: "
    return [x[len(prefix) :] for x in stderr.splitlines() if x.startswith(prefix)]


def test_start_up_prints_each_models_phases_in_order(tmp_path):
    srv = Server(write_policy(tmp_path), log_dir=tmp_path)
    try:
        stderr = srv.stderr()
    finally:
        assert srv.stop(signal.SIGINT) == 0
    for model in ("slm", "llm"):
        lines = phase_lines(stderr, model)
        expected = [r"starting \(pid \d+\)", r"torch \S+ imported in \d+\.\d s",
                    r"weights loaded in \d+\.\d s \(float32 on cpu\)", r"KV pool of [\d,]+ tokens \(\d+ MiB\)",
                    r"ready on cpu"]  # fmt: skip
        assert len(lines) == len(expected), (model, stderr)  # no CUDA graphs, no Triton kernels on CPU
        for line, pattern in zip(lines, expected, strict=True):
            assert re.fullmatch(pattern, line), (model, line, stderr)


def _stop_and_check(srv: Server, sig: int, to_group: bool) -> None:
    sid = srv.proc.pid  # the launcher leads its own session (start_new_session)
    assert len(session_pids(sid)) >= 4  # the launcher, two subservers, the frontend
    sent = time.monotonic()
    (os.killpg if to_group else os.kill)(srv.proc.pid, sig)
    code = srv.proc.wait(30)
    took = time.monotonic() - sent
    left = session_pids(sid)
    print(f"SIG{signal.Signals(sig).name[3:]}: the launcher exited {took:.2f} s after the signal")
    srv.stop()
    assert code == 0, srv.stderr()
    assert took < EXIT_BOUND_S, f"{took:.1f} s from the signal to the launcher's exit"
    assert not left, f"still alive after the launcher's exit: {[describe(p) for p in left]}"


@pytest.mark.parametrize(
    ("sig", "to_group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["ctrl-c-to-the-group", "sigterm-to-the-launcher"],
)
def test_a_signal_stops_every_process_promptly(tmp_path, sig, to_group):
    _stop_and_check(Server(write_policy(tmp_path), log_dir=tmp_path), sig, to_group)


def test_a_dead_subserver_stops_every_process(tmp_path):
    srv = Server(write_policy(tmp_path), log_dir=tmp_path)
    sid = srv.proc.pid
    try:
        run_dir = Path(httpx.get(f"{srv.url}/server_info", timeout=10).json()["run_dir"])
        pids = json.loads((run_dir / "pids.json").read_text())
        os.kill(pids["subservers"]["llm"], signal.SIGKILL)
        code = srv.proc.wait(30)
        left = session_pids(sid)
    finally:
        srv.stop()
    assert code == 1 and "subserver 'llm' failed: killed by SIGKILL" in srv.stderr(), srv.stderr()
    assert not left, f"still alive after the launcher's exit: {[describe(p) for p in left]}"
    assert not run_dir.exists()


def _leave_a_helper(pid_file: str) -> None:
    """A child that starts a helper process in its process group and exits without it."""
    helper = subprocess.Popen(["sleep", "600"])
    Path(pid_file).write_text(str(helper.pid))


def test_shutdown_kills_what_a_child_left_in_its_process_group(tmp_path):
    """A helper that a child started (in the child's process group, as `_child_main` makes it) is gone once
    the launcher has shut down, though the child exited without stopping it."""
    pid_file = tmp_path / "helper.pid"
    launcher = Launcher(ServeConfig(plan="unused.plan"))
    child = mp.get_context("spawn").Process(target=_child_main, args=(_leave_a_helper, str(pid_file)))
    child.start()
    launcher.procs["slm"] = child
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    helper = int(pid_file.read_text())
    assert wait([child.sentinel], 60), "the child did not exit"
    launcher._shutdown()
    assert child.exitcode == 0
    time.sleep(0.2)
    stat = Path(f"/proc/{helper}/stat")
    alive = stat.exists() and stat.read_text().split()[2] != "Z"
    if alive:
        os.kill(helper, signal.SIGKILL)
    assert not alive, "the child's helper outlived the shutdown"
