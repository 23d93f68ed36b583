"""Helpers for the serving tests: a real `tokenrouter serve` subprocess on the tiny example models."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "examples" / "models"
START_TIMEOUT_S = 120.0

# Both models write: the small one hands over with probability 0.3, the large one hands back with 0.7.
MIX_POLICY = """\
policy testmix "test policy: both tiny models write"
model slm = "{small}" {{ gpu: 0, batch: 2 }}
model llm = "{large}" {{ gpu: 0, batch: 1 }}
serve {{ concurrency: 8, max_delay_ms: 5 }}
entry slm
route slm {{
  when uniform() < 0.3 -> llm
}}
route llm {{
  when uniform() < 0.7 -> slm
}}
"""


def write_policy(
    folder: Path, small: Path | str = MODELS / "tiny-small", large: Path | str = MODELS / "tiny-large"
) -> Path:
    path = folder / "testmix.tr"
    path.write_text(MIX_POLICY.format(small=small, large=large))
    return path


class Server:
    """`tokenrouter serve PLAN --port 0 --device cpu ...` in a subprocess; `url` is parsed from its one line of
    output. CPU even where a GPU is present, so timings stay comparable (the first GPU steps compile kernels)."""

    def __init__(self, plan: Path, *extra: str, log_dir: Path, port: int = 0) -> None:
        self.plan = plan
        self.stderr_path = log_dir / "serve.stderr"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tokenrouter.cli",
                "serve",
                str(plan),
                "--port",
                str(port),
                "--device",
                "cpu",
                *extra,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            start_new_session=True,  # like a terminal: stop(SIGINT) signals the launcher's whole group
        )
        self.url = self._read_url()

    def _read_url(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                found = re.search(r"http://\S+", line)
                if found:
                    return found.group(0)
                if not line:  # EOF: the launcher exited
                    break
            elif self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"tokenrouter serve did not start:\n{self.stderr()}")

    def stderr(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text()

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._stderr.close()
        self.proc.stdout.close()
        return self.proc.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(url: str, headers: dict | None = None) -> dict[str, float]:
    """The /metrics samples as {'name{labels}': value}."""
    text = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=10).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def wait_all_pages_free(url: str, models: list[str], timeout: float = 15.0) -> dict[str, float]:
    """Poll /metrics until no request is active and every page of every model's KV pool is free or in its prefix
    cache (which gives pages back on demand)."""
    deadline = time.monotonic() + timeout
    while True:
        mt = metrics(url)
        free = all(
            f'tokenrouter_kv_pages_free{{model="{x}"}}' in mt
            and mt[f'tokenrouter_kv_pages_free{{model="{x}"}}']
            + mt.get(f'tokenrouter_prefix_cached_tokens{{model="{x}"}}', 0.0)
            == mt[f'tokenrouter_kv_pages_total{{model="{x}"}}']
            for x in models
        )
        if free and mt["tokenrouter_requests_active"] == 0:
            return mt
        if time.monotonic() > deadline:
            pytest.fail(f"KV pages not all free after {timeout} s: {mt}")
        time.sleep(0.2)
