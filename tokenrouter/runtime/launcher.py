"""`tokenrouter serve`: start one subserver process per model and the frontend, supervise, shut down.

The launcher is the parent of every process of a deployment. It
1. reads the plan (a `.tr` source is compiled on the fly into the run directory), checks the model folders,
   and applies `--mode` (`runtime/modes.py`: a baseline may rewrite the plan, override engine settings, or
   start one lockstep process for every model, whose endpoints then all point at it);
2. creates a private (0700) run directory and the ZeroMQ endpoints (`ipc://` files in it, or `tcp://` on
   `--bind-host` (127.0.0.1) with `--tcp`; a `--remote MODEL=HOST:PORT` model's endpoint is `tcp://HOST:PORT`);
3. starts the local subservers and the frontend (multiprocessing *spawn*: never fork a process that may hold
   torch state), prints (stderr) for each remote model the `tokenrouter subserver` command to run on its
   host, waits until each one sends `Ready` (forwarding the subservers' `Ready` to the frontend, whose
   /health turns 200 when all have arrived), writes `pids.json` into the run directory and prints one line
   with the URL. Meanwhile it prints (stderr) a line per model per phase of its start-up as the subserver
   reports it (`Progress`: torch imported, weights loaded, KV pool, CUDA graphs captured, kernels warmed) and
   when it is ready;
4. supervises: SIGINT/SIGTERM → clean shutdown (`Shutdown` to the subservers, SIGTERM to the frontend, wait,
   kill stragglers and anything a child left in its process group, remove the run directory), exit status 0.
   A child leaves without the interpreter's teardown once its work is done (`children.child_main`), so that the
   launcher exits within about a second of the signal, with every process it started gone.

Failures. A subserver that sends `Fatal` or exits is **not restarted**: its in-flight requests hold KV and
state that died with it, and the other subservers may hold requests pending on it. The launcher tells the
frontend (a `Fatal` naming the subserver: every in-flight request fails with a 503 at once, new ones are
refused), gives it `FAIL_GRACE_S` to answer its clients, shuts the deployment down and exits with status 1
and a message naming the subserver. The same holds for the frontend process, and for a local subserver that
is alive but silent (frozen, or stuck in one step): the frontend finds it by its missing heartbeat after
`--liveness-timeout` seconds and sends the launcher a `Fatal` naming it, which the launcher kills (it would
answer neither `Shutdown` nor SIGTERM). Any `Fatal` the frontend receives reaches the launcher the same way.
Run it under a supervisor (systemd, Kubernetes) to restart the whole deployment.

The children are started in their own process group (Ctrl-C in a terminal reaches only the launcher, which
coordinates shutdown), and each exits on its own if the launcher disappears.

Remote subservers (`--remote`, docs/serving.md "Subservers on other hosts") are started by the user on their
own hosts; the launcher waits for their `Ready` like a local one's. Their death is not a process exit the
launcher can see: a crash sends `Fatal` (to the launcher and the frontend), and the frontend treats a remote
model whose `SubserverStats` heartbeat (every 0.5 s) stops for `--heartbeat-timeout` seconds as failed (it
fails its requests and sends the launcher a `Fatal` naming it). Both then follow the failure path above;
on shutdown the launcher sends `Shutdown` to the remote subservers too.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import zmq

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.children import child_main
from tokenrouter.runtime.ipc import Receiver, Sender, secure_context
from tokenrouter.runtime.launch_checks import (
    LaunchError,
    check_device,
    check_models,
    check_port,
    check_remote,
    check_vocab,
    exposure_warning,
    load_plan,
    make_endpoints,
)
from tokenrouter.runtime.launch_lines import (
    exit_text,
    last_line,
    late_remote,
    phase_line,
    ready_line,
    remote_wait_line,
    say,
    starting_line,
    what,
)
from tokenrouter.runtime.process_args import (
    busy_board,
    child_env,
    frontend_args,
    local_models,
    remote_command,
    subserver_args,
)
from tokenrouter.runtime.serve_config import ServeConfig, writable_folder
from tokenrouter.runtime.shutdown import send_shutdown, stop_processes
from tokenrouter.runtime.subserver.loading import gpu_count_problem

# what `serve`'s callers and tests import from here
__all__ = [
    "LaunchError",
    "Launcher",
    "ServeConfig",
    "exposure_warning",
    "load_plan",
    "serve",
    "writable_folder",
]
_child_main = child_main
# each child's function, by name: the child imports its module (torch, FastAPI), the launcher does not, so that
# it starts the children without first paying for their imports (`children.child_main`)
SUBSERVER_MAIN = "tokenrouter.runtime.subserver.process:run_subserver_process"
LOCKSTEP_MAIN = "tokenrouter.runtime.baselines.lockstep:run_lockstep_process"
FRONTEND_MAIN = "tokenrouter.runtime.frontend.process:run_frontend_process"

log = logging.getLogger("tokenrouter.launcher")

FAIL_GRACE_S = 1.0  # time the frontend gets to fail in-flight requests before the deployment stops
POLL_MS = 100


class Launcher:
    """One deployment. `run()` returns the process exit status."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.stop_signal: int | None = None
        self.procs: dict[str, Any] = {}  # name → multiprocessing.Process ("frontend" or a model name)
        self.ready: dict[str, dict] = {}
        self.run_dir: Path | None = None
        self.ctx: zmq.Context | None = None
        self.auth = None  # the ZAP handler of a --tcp deployment (ipc.secure_context)
        self.setup = None  # the mode's ModeSetup, from _apply_mode
        self.mps = None  # runtime.mps.MpsDaemon while one runs
        self.failed: str | None = None  # the process that failed (_supervise): killed at shutdown, not asked

    def _on_signal(self, signum, frame) -> None:
        self.stop_signal = signum

    def run(self) -> int:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._run()
        except LaunchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:
            self._shutdown()
            for s, h in old.items():
                signal.signal(s, h)

    def _run(self) -> int:
        plan, plan_path = self._prepare()
        self._open_endpoints(plan)
        self._start(plan, plan_path)
        self._print_remote_commands()
        failure = self._wait_ready()
        if failure is not None:
            raise LaunchError(failure)
        if self.stop_signal is not None:
            return 0
        self._write_pids()
        url = self.ready["frontend"].get("url")
        failure = self._wait_healthy(url)
        if failure is not None:
            raise LaunchError(failure)
        if self.stop_signal is not None:
            return 0
        print(
            f"tokenrouter: serving {plan['policy']['name']!r} ({', '.join(plan['models'])}) at {url}",
            flush=True,
        )
        failure = self._supervise()
        if failure is None:
            return 0
        print(f"error: {failure}; shut down (failed processes are not restarted)", file=sys.stderr)
        return 1

    def _prepare(self) -> tuple[dict, str]:
        """The run directory, and the plan (with its file) that the processes run, checked."""
        cfg = self.cfg
        self.run_dir = Path(tempfile.mkdtemp(prefix="tokenrouter-", dir=cfg.run_dir))
        os.chmod(self.run_dir, 0o700)
        plan, plan_path = load_plan(cfg.plan, self.run_dir, cfg.defines)
        check_models(plan)
        plan, plan_path = self._apply_mode(plan, plan_path)
        check_vocab(plan)
        if cfg.device != "cpu":  # each local model's share of its GPU where the plan has no `mem`
            from tokenrouter.runtime.memory_share import MemoryFitError, serve_sizing

            local = [x for x in plan["models"] if x not in cfg.remote]
            try:
                plan, plan_path = serve_sizing(plan, plan_path, self.run_dir, local)
            except MemoryFitError as e:
                raise LaunchError(str(e)) from None
        check_port(cfg.host, cfg.port)
        check_device(cfg.device)
        if problem := gpu_count_problem(plan, [x for x in plan["models"] if x not in cfg.remote], cfg.device):
            raise LaunchError(problem)
        if warning := exposure_warning(cfg.host, cfg.api_key):
            say(f"warning: {warning}")
        check_remote(plan, cfg.remote)
        return plan, plan_path

    def _open_endpoints(self, plan: dict) -> None:
        """The deployment's endpoints, and the launcher's own sockets on them."""
        models = list(plan["models"])
        self.endpoints = make_endpoints(
            models, self.run_dir, self.cfg.tcp, self.cfg.bind_host, self.cfg.remote
        )
        if self.setup.lockstep:  # one process serves every model: every model's address is the entry's
            entry = self.endpoints.subservers[plan["entry"]]
            self.endpoints.subservers = {x: entry for x in models}
        self.ctx = zmq.Context()
        self.auth = secure_context(self.ctx, self.endpoints.key)
        self.inbox = Receiver(self.ctx, self.endpoints.launcher, m.ToLauncher)
        self.to_frontend = Sender(self.ctx, self.endpoints.frontend)

    def _apply_mode(self, plan: dict, plan_path: str) -> tuple[dict, str]:
        """The plan the processes run for `--mode` (a rewritten plan is written into the run directory)."""
        from tokenrouter.compiler.plan import write_plan
        from tokenrouter.runtime.modes import ModeError, prepare

        try:
            self.setup = prepare(plan, self.cfg.mode, self.cfg.llm, self.cfg.batch)
        except ModeError as e:
            raise LaunchError(str(e)) from None
        if self.setup.plan is plan:
            return plan, plan_path
        path = self.run_dir / f"plan-{self.cfg.mode}.json"
        write_plan(self.setup.plan, path)
        return self.setup.plan, str(path)

    def _start(self, plan: dict, plan_path: str) -> None:
        """Start the local subservers (or the lockstep process) and the frontend (multiprocessing *spawn*)."""
        import multiprocessing as mp

        spawn = mp.get_context("spawn")
        eps = self.endpoints.to_dict()
        self._add_subservers(spawn, plan, plan_path, eps)
        fargs = frontend_args(self.cfg, plan, eps, self.run_dir)
        self.procs["frontend"] = spawn.Process(
            target=child_main, args=(FRONTEND_MAIN, fargs), name="tokenrouter-frontend"
        )
        self._start_mps(plan, [x for x in self.procs if x != "frontend"])
        for name, p in self.procs.items():
            p.start()
            if name != "frontend":
                say(starting_line(name, p.pid))

    def _add_subservers(self, spawn, plan: dict, plan_path: str, eps: dict) -> None:
        """A process (not started yet) for each local subserver, or the lockstep process."""
        board = busy_board(plan, self.run_dir, self.setup)
        target = LOCKSTEP_MAIN if self.setup.lockstep else SUBSERVER_MAIN
        for name in local_models(plan, self.cfg, self.setup.lockstep):
            args = subserver_args(self.cfg, self.setup, name, plan_path, eps, board)
            self.procs[name] = spawn.Process(
                target=child_main, args=(target, args, self._child_env(name)), name=f"tokenrouter-{name}"
            )

    def _child_env(self, model: str) -> dict[str, str]:
        return child_env(self.cfg, model)

    def _start_mps(self, plan: dict, local: list[str]) -> None:
        from tokenrouter.runtime.mps import start_for_launch

        self.mps = start_for_launch(self.run_dir, plan, local, self.cfg)

    def remote_command(self, model: str) -> str:
        """The command that starts a remote model's subserver on its host (the plan copied to the same path)."""
        return remote_command(self.cfg, self.endpoints, model)

    def _print_remote_commands(self) -> None:
        for model in self.cfg.remote:
            say(remote_wait_line(model, self.endpoints.subservers[model], self.remote_command(model)))

    def _drain(self) -> list:
        out = []
        if self.inbox.poll(POLL_MS):
            try:
                out = self.inbox.drain()
            except msgspec.DecodeError as e:
                log.error("undecodable message to the launcher: %s", e)
        return out

    def _wait_ready(self) -> str | None:
        """None when every process is ready (or a signal asked to stop), else what went wrong."""
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        # every process, and every model (the lockstep process serves several), must say Ready
        while (
            not (set(self.procs) | set(self.endpoints.subservers)) <= set(self.ready)
            and self.stop_signal is None
        ):
            if (failure := self._take_ready()) is not None:
                return failure
            for name, p in self.procs.items():
                if name not in self.ready and not p.is_alive():
                    # a Fatal may be on its way
                    return self._take_ready() or f"{what(name)} {exit_text(p.exitcode)} during startup"
            if time.monotonic() > deadline:
                return f"not ready after {self.cfg.startup_timeout_s:g} s: {', '.join(self._late())}"
        return None

    def _wait_healthy(self, url: str) -> str | None:
        """The Ready messages reach the frontend through a socket of their own: the URL line waits until its
        /health says 200, so that a request sent as soon as the line appears is served, not refused as early."""
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + self.cfg.startup_timeout_s
        local = url.replace("://0.0.0.0:", "://127.0.0.1:").replace("://[::]:", "://[::1]:")
        while self.stop_signal is None:
            try:
                with urllib.request.urlopen(f"{local}/health", timeout=5) as r:
                    if r.status == 200:
                        return None
            except (urllib.error.URLError, OSError):
                pass
            if not self.procs["frontend"].is_alive():
                return f"the frontend {exit_text(self.procs['frontend'].exitcode)} during startup"
            if time.monotonic() > deadline:
                return f"the frontend's /health was not 200 after {self.cfg.startup_timeout_s:g} s"
            time.sleep(0.02)
        return None

    def _take_ready(self) -> str | None:
        """Take the messages waiting: a `Fatal`'s description, or None once each `Ready`/`Progress` is handled."""
        for msg in self._drain():
            if isinstance(msg, m.Fatal):
                return f"{what(msg.name)} failed to start: {last_line(msg.error)}"
            self._on_ready(msg)
        return None

    def _late(self) -> list[str]:
        """The processes, and remote subservers, that have not said Ready."""
        late = [repr(x) for x in self.procs if x not in self.ready]
        late += [late_remote(x, self.endpoints.subservers[x]) for x in self.cfg.remote if x not in self.ready]
        return late

    def _on_ready(self, msg: m.Ready | m.Progress) -> None:
        """A Ready (forwarded to the frontend; a model's ready line printed), or a Progress before it (printed)."""
        if isinstance(msg, m.Progress):
            say(phase_line(msg.name, msg.detail))
            return
        if msg.name != "frontend":
            say(ready_line(msg.name, msg.info))
        info = dict(msg.info)
        info.setdefault("pid", self.procs[msg.name].pid if msg.name in self.procs else None)
        self.ready[msg.name] = info
        if msg.name != "frontend":
            self.to_frontend.send(m.Ready(name=msg.name, info=info))

    def _write_pids(self) -> None:
        pids = {
            "launcher": os.getpid(),
            "frontend": self.procs["frontend"].pid,
            "subservers": {x: p.pid for x, p in self.procs.items() if x != "frontend"},
            "remote": {x: self.endpoints.subservers[x] for x in self.cfg.remote},
            "url": self.ready["frontend"].get("url"),
        }
        (self.run_dir / "pids.json").write_text(json.dumps(pids, indent=2) + "\n")

    def _supervise(self) -> str | None:
        """Until a signal (None) or a failure (its description)."""
        while self.stop_signal is None:
            failed = self._failure()
            if failed is not None:
                name, detail = failed
                self.failed = name
                self.to_frontend.send(m.Fatal(name=name, error=detail))
                time.sleep(FAIL_GRACE_S)
                return f"{what(name)} failed: {detail}"
        return None

    def _failure(self) -> tuple[str, str] | None:
        """(name, what happened) of the first process that sent `Fatal` or exited; None while all run."""
        failed: tuple[str, str] | None = None
        for msg in self._drain():
            if isinstance(msg, m.Fatal) and failed is None:
                failed = (msg.name, last_line(msg.error))
        if failed is None:
            for name, p in self.procs.items():
                if not p.is_alive():
                    return name, exit_text(p.exitcode)
        return failed

    def _shutdown(self) -> None:
        """Stop every child (gently, then by force) and whatever it left in its process group, close sockets,
        remove the run directory. Idempotent."""
        if self.ctx is not None:
            send_shutdown(self.ctx, self.endpoints.subservers, self._answering())
        stop_processes(self.procs, self.ready, self.failed)
        self.procs.clear()
        if self.mps is not None:
            self.mps.stop()
            self.mps = None
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
        if self.ctx is not None:
            self.ctx.destroy(linger=0)
            self.ctx = None
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None

    def _answering(self) -> set[str]:
        """The subservers that can take a `Shutdown`: ready, and alive here or remote."""
        return {
            name
            for name in self.endpoints.subservers
            if name in self.ready
            and ((p := self.procs.get(name)) is not None and p.is_alive() or name in self.cfg.remote)
        }


def serve(cfg: ServeConfig) -> int:
    """Run a deployment until a signal or a failure; the process exit status."""
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s launcher %(levelname)s %(message)s")
    return Launcher(cfg).run()
