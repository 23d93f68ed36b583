"""One `tokenrouter serve` for a benchmark script: started in its own session, its URL read from the one line
it prints on stdout, stopped with SIGINT to its process group (SIGKILL after 60 s). `Server.live` holds the
servers not yet stopped, so that a script's exit can stop them wherever it was interrupted (`stop_live`)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Server:
    live: set[Server] = set()

    def __init__(
        self,
        plan: Path,
        args: list[str],
        log: Path,
        timeout: float = 900.0,
        on_start: Callable[[int], None] | None = None,
    ) -> None:
        """`tokenrouter serve PLAN --port 0 ARGS...`, its stderr in `log`; RuntimeError (naming the log's last
        lines) if no URL came within `timeout` seconds. `on_start(pid)` is called once the process runs, before
        its URL is waited for."""
        self.err = open(log, "w")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "tokenrouter.cli", "serve", str(plan), "--port", "0", *args]
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     start_new_session=True)  # fmt: skip
        Server.live.add(self)
        try:
            if on_start is not None:
                on_start(self.proc.pid)
            self.url = self._url(t0 + timeout, log)
        except BaseException:  # a failed start, or SIGTERM while it starts: no server outlives this object
            self.stop()
            raise
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
        Server.live.discard(self)


def exit_on_sigterm(signum, frame) -> None:
    """A SIGTERM handler (`signal.signal(signal.SIGTERM, exit_on_sigterm)` in a script's `__main__`): SIGTERM, as
    `timeout` sends, unwinds like an exception, through each server's stop in a `finally` and `stop_live`.
    Without it a killed script left its servers, each in a session of its own, holding the GPU (111 GiB once,
    and the next server could not start)."""
    raise SystemExit(128 + signum)


def stop_live() -> None:
    """Stop every server still up: a SIGTERM can land between a server's start and the `try` whose `finally`
    stops it."""
    for srv in list(Server.live):
        srv.stop()


def prom_values(text: str) -> dict[str, float]:
    """{series as written, e.g. `name{model="slm",bs="3"}`: value} of a /metrics text (samples only; a value
    that is not a number is passed over)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out
