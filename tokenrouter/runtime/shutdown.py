"""Stopping a deployment: `Shutdown` to the subservers that can answer it, then every child process gently, then
by force, with whatever it left in its process group."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Any

import msgspec
import zmq

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.children import wait_exits
from tokenrouter.runtime.launch_lines import what

log = logging.getLogger("tokenrouter.launcher")

JOIN_TIMEOUT_S = 10.0  # then stragglers are killed


def send_shutdown(ctx: zmq.Context, addresses: dict[str, str], answering: set[str]) -> None:
    """`Shutdown` to each subserver of `addresses` (name → endpoint) named in `answering`; a full queue is
    passed over (the process is then stopped by signal)."""
    for name, addr in addresses.items():
        if name not in answering:
            continue
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 500)
        s.connect(addr)
        try:
            s.send(msgspec.msgpack.encode(m.Shutdown()), zmq.NOBLOCK)
        except zmq.Again:
            pass
        s.close()


def stop_processes(procs: dict[str, Any], ready: dict, failed: str | None) -> None:
    """Stop every process of `procs` (name → multiprocessing.Process): the `failed` one is killed (frozen or
    stuck, it would answer neither `Shutdown` nor SIGTERM), the frontend and any process still loading get
    SIGTERM, the rest were sent `Shutdown`; those not gone after `JOIN_TIMEOUT_S` are killed, and so is
    whatever each left in its process group."""
    proc = procs.get(failed)
    if proc is not None and proc.pid is not None and proc.is_alive():
        proc.kill()
    for name, p in procs.items():
        if p.pid is not None and p.is_alive() and (name == "frontend" or name not in ready):
            p.terminate()
    started = {name: p for name, p in procs.items() if p.pid is not None}
    for name in wait_exits(started, JOIN_TIMEOUT_S):
        log.warning("%s did not stop in time; killing it", what(name))
        started[name].kill()
    for p in started.values():
        # what a child started and left behind (its process group is its pid: `child_main`); killed
        # before `join` reaps the child, so that the group's number is still the child's
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        p.join(5.0)
    if started and all(p.exitcode is not None for p in started.values()):
        stop_resource_tracker()


def stop_resource_tracker() -> None:
    """Stop multiprocessing's resource tracker, a process in the launcher's group that starting the children
    started: it exits only once every process holding its pipe has, which would be after the launcher."""
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # CPython 3.8 on
    if stop is not None:
        with contextlib.suppress(Exception):
            stop()
