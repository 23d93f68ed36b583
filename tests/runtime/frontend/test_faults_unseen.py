"""Faults the launcher cannot see as a process exit: a frozen local subserver, and (with --tcp) messages from
processes outside the deployment. Real deployments on the tiny models, CPU."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
from frontend_helpers import Server, write_policy

LIVENESS_S = 2.0


def test_a_frozen_subserver_is_detected_within_the_deadline_and_the_deployment_stops(tmp_path):
    srv = Server(write_policy(tmp_path), "--liveness-timeout", str(LIVENESS_S), log_dir=tmp_path)
    try:
        info = httpx.get(f"{srv.url}/server_info", timeout=10).json()
        pid = info["subservers"]["llm"]["pid"]
        result: dict = {}

        def long_request() -> None:
            body = {"prompt": "def f(x):", "max_tokens": 3000, "ignore_eos": True}
            r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
            result["at"], result["r"] = time.monotonic(), r

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(1.0)
        os.kill(pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        health = []
        while t.is_alive() or not health or health[-1] == 200:
            try:
                health.append(httpx.get(f"{srv.url}/health", timeout=2).status_code)
            except httpx.TransportError:
                break
            time.sleep(0.1)
        t.join(30)
        r = result["r"]
        assert r.status_code == 503 and "no heartbeat" in r.json()["error"]["message"], r.text
        assert result["at"] - frozen_at < LIVENESS_S + 1.5, f"{result['at'] - frozen_at:.1f} s to fail it"
        assert 503 in health, health
        assert srv.wait(30) == 1
        assert "subserver 'llm' failed" in srv.stderr() and "frozen" in srv.stderr()
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    finally:
        srv.stop()
