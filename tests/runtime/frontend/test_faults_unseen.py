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


def test_tcp_messages_from_outside_the_deployment_are_never_heard(tmp_path):
    """With --tcp, a process that is not of the deployment (no key) pushes a Fatal to the frontend and the
    launcher and a request to a subserver: none is delivered, and the deployment serves on. The key is not
    in /server_info."""
    import msgspec
    import zmq

    from tokenrouter.runtime import messages as m

    srv = Server(write_policy(tmp_path), "--tcp", log_dir=tmp_path)
    try:
        info = httpx.get(f"{srv.url}/server_info", timeout=10).json()
        eps = info["endpoints"]
        assert "key" not in eps and eps["frontend"].startswith("tcp://")
        ctx = zmq.Context()
        try:
            fatal = msgspec.msgpack.encode(m.Fatal(name="llm", error="injected"))
            spec = m.SamplingSpec(top_k=2**40, max_tokens=5)
            new = msgspec.msgpack.encode(m.NewRequest(rid="x", prompt_ids=[1, 2], sampling=spec, n_active=1))
            socks = []  # kept open until the end: a socket closed at once drops what it has not sent
            for addr, data in (
                (eps["frontend"], fatal),
                (eps["launcher"], fatal),
                (eps["subservers"]["slm"], new),
            ):
                socks.append(ctx.socket(zmq.PUSH))
                socks[-1].connect(addr)
                socks[-1].send(data)
            time.sleep(1.5)
        finally:
            ctx.destroy(linger=0)
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "x =", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200, r.text
        assert srv.proc.poll() is None and "injected" not in srv.stderr()
    finally:
        assert srv.stop() == 0, srv.stderr()
