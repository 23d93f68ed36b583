"""The lines the launcher prints (stderr, but for the one that says where the deployment serves) and the words
it names a process and its end with."""

from __future__ import annotations

import signal
import sys


def say(line: str) -> None:
    """One `tokenrouter: ...` line on stderr, flushed (the children's output interleaves with it)."""
    print(f"tokenrouter: {line}", file=sys.stderr, flush=True)


def what(name: str) -> str:
    return "the frontend" if name == "frontend" else f"subserver {name!r}"


def last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else "unknown error"


def exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def starting_line(model: str, pid: int | None) -> str:
    return f"model {model}: starting (pid {pid})"


def phase_line(model: str, detail: str) -> str:
    """A subserver's `Progress`: one phase of its start-up."""
    return f"model {model}: {detail}"


def ready_line(model: str, info: dict) -> str:
    return f"model {model}: ready on {info.get('device', '?')}"


def remote_wait_line(model: str, address: str, command: str) -> str:
    return (
        f"waiting for remote subserver {model!r} at {address}; "
        f"start it on that host (with the plan and model folders copied there) with:\n"
        f"  {command}"
    )


def late_remote(model: str, address: str) -> str:
    """A remote subserver that sent no `Ready` before the startup timeout."""
    return (
        f"remote subserver {model!r} (no Ready from {address}: was "
        "`tokenrouter subserver` started on its host, and can it reach --bind-host?)"
    )
