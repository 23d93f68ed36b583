"""bench/matrix.py killed by SIGTERM (as `timeout` kills it) stops the server it started, subservers and all:
a killed part once left a whole deployment holding the GPU, and the next part's model could not start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tree(root: int) -> set[int]:
    """`root` and every process below it, from /proc."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += [c for c, p in parents.items() if p == pid and c not in found]
    return found


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_stops_the_server_and_its_subservers(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench" / "matrix.py"), "--pair", "tiny", "--policy", "bern0.35",
           "--run", "llm-only:1", "--rounds", "50", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w")]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deployment: set[int] = set()
    try:
        seen = []
        for line in proc.stdout:  # the server is up once the matrix says it serves
            seen.append(line)
            if "serving llm-only" in line:
                break
        assert seen and "serving llm-only" in seen[-1], "".join(seen)  # not a matrix that ended early
        deployment = tree(proc.pid) - {proc.pid}
        assert len(deployment) >= 3, deployment  # serve's launcher, its frontend and the subserver
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 30
        while (left := {p for p in deployment if alive(p)}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"still running after the matrix exited: {left}"
    finally:
        for pid in {proc.pid} | deployment:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)
