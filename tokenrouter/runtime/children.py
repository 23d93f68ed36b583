"""The launcher's child processes: the function each runs in (`child_main`), and waiting for them to exit."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any


def child_main(fn, args, env: dict[str, str] | None = None) -> None:
    """Runs in each child: its own process group, and exit when the launcher is gone. `env` is set
    before anything in the child touches CUDA (an MPS client reads its settings when its context starts).
    `fn`: the function to run, or its "module:function" name, imported here (so that the launcher need not
    import the child's modules, torch among them, before it can start the child)."""
    os.environ.update(env or {})
    os.setpgrp()
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    code = 0
    try:
        if isinstance(fn, str):
            module, _, name = fn.partition(":")
            fn = getattr(importlib.import_module(module), name)
        fn(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    # Leave without the interpreter's teardown: by now `fn` has closed its sockets and written its files, and
    # with torch loaded the teardown took 2-3 s of a loaded 2-core machine, which the launcher waited for.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _watch_parent(parent: int) -> None:
    """SIGTERM to this process once `parent` is gone, and exit 5 s later if that did not end it."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5.0)
    os._exit(1)


def wait_exits(procs: dict[str, Any], timeout_s: float) -> list[str]:
    """Wait until every process of `procs` (name → started multiprocessing.Process) has exited or `timeout_s`
    has passed, without reaping any; the names of those still running."""
    from multiprocessing.connection import wait

    deadline = time.monotonic() + timeout_s
    running = {p.sentinel: name for name, p in procs.items()}
    while running and (left := deadline - time.monotonic()) > 0:
        for sentinel in wait(list(running), left):
            del running[sentinel]
    return list(running.values())
