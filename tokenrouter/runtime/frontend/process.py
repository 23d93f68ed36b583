"""The frontend process's entry function: bind the HTTP socket, serve, tell the launcher.

Signals: SIGINT is ignored (Ctrl-C reaches the whole process group; the launcher coordinates shutdown),
SIGTERM fails the requests in flight (503, "shutting down") and stops uvicorn. If the launcher disappears, the frontend exits on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import traceback

import uvicorn
import zmq

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.frontend.config import FrontendArgs
from tokenrouter.runtime.ipc import Sender, secure_context

log = logging.getLogger("tokenrouter.frontend")


def run_frontend_process(args: FrontendArgs) -> None:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s frontend %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctx = zmq.Context()
    auth = secure_context(ctx, args.endpoints.get("key"))
    to_launcher = Sender(ctx, args.endpoints["launcher"])
    try:
        sock = _listen(args.host, args.port)
        asyncio.run(_serve(args, sock, to_launcher))
    except Exception as e:
        log.error("frontend failed:\n%s", traceback.format_exc())
        to_launcher.send(m.Fatal(name="frontend", error=f"{type(e).__name__}: {e}"))
        _flush(to_launcher)
        raise SystemExit(1) from None
    finally:
        if auth is not None:
            auth.stop()
        ctx.destroy(linger=500)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


async def _serve(args: FrontendArgs, sock: socket.socket, to_launcher: Sender) -> None:
    from tokenrouter.runtime.frontend.app import build_app
    from tokenrouter.runtime.frontend.codec import TextCodec

    codec = TextCodec(args.model_dir)
    app = build_app(args, codec)
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, timeout_graceful_shutdown=0.5)
    server = _Server(config)
    loop = asyncio.get_running_loop()

    def on_sigterm() -> None:  # fail in-flight requests with a clear 503 before the connections close
        manager = getattr(app.state, "manager", None)
        if manager is not None:
            manager.shutdown()
        server.should_exit = True

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    await _started(server, serving)
    to_launcher.send(m.Ready(name="frontend", info={"url": _url(sock), "pid": os.getpid()}))
    watchdog = asyncio.create_task(_exit_with_parent(server))
    try:
        await serving
    finally:
        watchdog.cancel()


async def _started(server: _Server, serving: asyncio.Task) -> None:
    """Wait until the HTTP server listens; raise if it stopped instead."""
    while not server.started:
        if serving.done():
            serving.result()
            raise RuntimeError("the HTTP server stopped during startup")
        await asyncio.sleep(0.02)


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    url_host = f"[{host}]" if ":" in host else host
    return f"http://{url_host}:{port}"


async def _exit_with_parent(server) -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    log.error("the launcher is gone; stopping")
    server.should_exit = True


def _flush(sender: Sender) -> None:
    with contextlib.suppress(zmq.ZMQError):
        sender.sock.setsockopt(zmq.LINGER, 1000)


class _Server(uvicorn.Server):
    """uvicorn's Server without its own signal handlers (this process installs its own)."""

    def capture_signals(self):  # type: ignore[override]
        return contextlib.nullcontext()
