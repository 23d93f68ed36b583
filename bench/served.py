"""One `tokenrouter serve` for a benchmark script: started in its own session, its URL read from the one line
it prints on stdout, stopped with SIGINT to its process group (SIGKILL after 60 s)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Server:
    def __init__(self, plan: Path, args: list[str], log: Path, timeout: float = 900.0) -> None:
        """`tokenrouter serve PLAN --port 0 ARGS...`, its stderr in `log`; RuntimeError (naming the log's last
        lines) if no URL came within `timeout` seconds."""
        self.err = open(log, "w")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "tokenrouter.cli", "serve", str(plan), "--port", "0", *args]
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     start_new_session=True)  # fmt: skip
        self.url = self._url(t0 + timeout, log)
        self.startup_s = time.monotonic() - t0

    def _url(self, deadline: float, log: Path) -> str:
        while time.monotonic() < deadline:
            if select.select([self.proc.stdout], [], [], 0.5)[0]:
                line = self.proc.stdout.readline()
                if found := re.search(r"http://\S+", line):
                    return found.group(0)
                if not line:
                    break
            elif self.proc.poll() is not None:
                break
        self.stop()
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-3:]
        raise RuntimeError(f"the server did not start ({log}): " + " | ".join(tail))

    def stop(self) -> None:
        """Safe to call twice."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if not self.proc.stdout.closed:
            self.proc.stdout.close()
        self.err.close()
