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
   A child leaves without the interpreter's teardown once its work is done (`_child_main`), so that the
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

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import zmq

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.frontend.config import BODY_TIMEOUT_S, MAX_BODY_BYTES
from tokenrouter.runtime.ipc import Endpoints, Receiver, Sender, new_key, secure_context, tcp_url
from tokenrouter.runtime.subserver.loading import gpu_count_problem

log = logging.getLogger("tokenrouter.launcher")

FAIL_GRACE_S = 1.0  # time the frontend gets to fail in-flight requests before the deployment stops
JOIN_TIMEOUT_S = 10.0  # then stragglers are killed
POLL_MS = 100
DEVICES = ("cpu", "cuda")


class LaunchError(Exception):
    """A problem with the user's input or environment; the message says what and where (exit status 1)."""


@dataclass(slots=True)
class ServeConfig:
    plan: str  # a .plan (JSON) file, or a .tr source compiled on the fly
    defines: dict[str, str] = field(
        default_factory=dict
    )  # -D NAME=VALUE: a .tr source's params, as compile's
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the printed URL has the one chosen)
    api_key: str | None = None
    tcp: bool = False
    device: str | None = None  # None: the plan's placement (CUDA when available, else CPU)
    startup_timeout_s: float = 600.0
    log_level: str = "warning"
    run_dir: str | None = None  # parent folder for the private run directory (default: the system temp dir)
    extra_subserver: dict = field(default_factory=dict)
    mode: str = "tokenrouter"  # or a baseline (runtime/modes.py)
    llm: str | None = None  # --mode llm-only: the model to serve (default: the largest)
    bind_host: str = "127.0.0.1"  # with tcp: launcher, frontend, local subservers bind (and are reached) here
    remote: dict[str, str] = field(default_factory=dict)  # model → "HOST:PORT": started by hand on that host
    heartbeat_timeout_s: float = 10.0  # a remote model silent this long is treated as dead
    liveness_timeout_s: float = 60.0  # a local subserver silent this long (frozen, stuck) is treated as dead
    mps: str = "auto"  # CUDA MPS for local subservers sharing a GPU: auto | on | off (runtime/mps.py)
    mps_sm: dict[str, int] = field(default_factory=dict)  # model → % of the GPU's SMs its kernels may use
    mps_low: list[str] = field(default_factory=list)  # models whose MPS client priority is below normal
    batch: dict[str, int] = field(default_factory=dict)  # --batch: thresholds replacing the plan's
    cpu_threads: int | None = None  # torch threads per subserver (None: threads_per_subserver)
    max_body_mib: float = MAX_BODY_BYTES / (1 << 20)  # a longer request body gets a 413 (FrontendArgs)
    body_timeout_s: float = BODY_TIMEOUT_S  # a request body not in full after this long gets a 408
    profile_dir: str | None = None  # POST /start_profile, /stop_profile write torch.profiler traces here
    prefix_cache: bool = True  # the engines' prefix cache (runtime/prefix_cache.py); --no-prefix-cache: off

    def __post_init__(self) -> None:
        from tokenrouter.runtime.modes import MODES
        from tokenrouter.runtime.mps import MODES as MPS_MODES

        if self.defines and Path(self.plan).suffix != ".tr":
            raise ValueError("-D applies to a .tr policy; a plan's params are already bound")
        if self.defines and self.remote:
            raise ValueError(
                "-D with --remote: compile the policy with -D first and serve that plan, so that the remote "
                "subservers run the same one"
            )
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"--cpu-threads {self.cpu_threads}: at least 1")
        if self.profile_dir is not None:
            self.profile_dir = writable_folder(self.profile_dir, "--profile-dir")
        if not (math.isfinite(self.max_body_mib) and self.max_body_mib * (1 << 20) >= 1024):
            raise ValueError(f"--max-body-mib {self.max_body_mib:g}: a finite size of at least 1 KiB (0.001)")
        if self.mps not in MPS_MODES:
            raise ValueError(f"--mps {self.mps}: expected one of {', '.join(MPS_MODES)}")
        for model, pct in self.mps_sm.items():
            if not 1 <= pct <= 100:
                raise ValueError(f"--mps-sm {model}={pct}: a percentage from 1 to 100")
            if self.mps == "off":
                raise ValueError("--mps-sm needs MPS (not --mps off)")
        if self.mps_low and self.mps == "off":
            raise ValueError("--mps-low needs MPS (not --mps off)")

        if self.remote:
            if not self.tcp:
                raise ValueError("--remote needs --tcp (subservers on other hosts talk over tcp://)")
            if self.mode != "tokenrouter":
                raise ValueError("--remote works with --mode tokenrouter only")
            for model, addr in self.remote.items():
                host, sep, port = addr.rpartition(":")
                if not model or not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
                    raise ValueError(f"--remote {model}={addr}: expected MODEL=HOST:PORT")
        if self.bind_host.strip("[]") in ("0.0.0.0", "::", "*", ""):
            raise ValueError(
                "--bind-host must be an address of this host that the remote hosts can reach (it is also the "
                f"address they connect to), not {self.bind_host!r}"
            )
        for flag, seconds in (("--heartbeat-timeout", self.heartbeat_timeout_s),
                              ("--liveness-timeout", self.liveness_timeout_s),
                              ("--body-timeout", self.body_timeout_s)):  # fmt: skip
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"{flag} must be a finite number of seconds > 0, got {seconds}")

        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.llm is not None and self.mode != "llm-only":
            raise ValueError("--llm applies to --mode llm-only only")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        if self.device is not None and self.device not in DEVICES:
            raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key must not be empty")
        if self.startup_timeout_s <= 0:
            raise ValueError(f"the startup timeout must be > 0, got {self.startup_timeout_s}")
        if not isinstance(logging.getLevelName(self.log_level.upper()), int):
            raise ValueError(f"unknown log level {self.log_level!r}")


# ---- the plan ---------------------------------------------------------------------------------------------


def writable_folder(path: str, flag: str) -> str:
    """`path` as an absolute folder this process can write into, made if missing; a ValueError that says why
    not."""
    folder = Path(path).expanduser().absolute()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{flag} {path}: not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot make the folder: {e.strerror or e}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: the folder is not writable")
    return str(folder)


def load_plan(path: str, run_dir: Path, defines: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """(plan, path of a plan file the subservers can read). A .tr source is compiled into run_dir, its params
    overridden by `defines` (`-D`); a model given as a hub id is fetched into the hub cache unless there (or
    offline) and the plan written into run_dir names its local folder."""
    from tokenrouter.compiler.driver import load_plan as load
    from tokenrouter.compiler.plan import PlanError, write_plan
    from tokenrouter.hub import HubError, resolve_models

    if not Path(path).exists():
        raise LaunchError(f"{path}: no such file")
    try:
        plan = load(path, defines)
        fetched = resolve_models(plan, fetch=True, source=path)
    except (PlanError, HubError) as e:
        raise LaunchError(str(e)) from None
    if Path(path).suffix == ".tr" or fetched:
        path = str(run_dir / "plan.json")
        write_plan(plan, path)
        plan = load(path)  # as the subservers will read it
    return plan, path


def check_models(plan: dict[str, Any]) -> None:
    """Every model folder exists (the embedded engine loads local folders only); the entry has a tokenizer."""
    for name, spec in plan["models"].items():
        folder = Path(spec["path"])
        if spec.get("engine", "embedded") == "embedded" and not folder.is_dir():
            raise LaunchError(f"model {name!r}: no model folder at {folder}")
    entry = Path(plan["models"][plan["entry"]]["path"])
    if entry.is_dir() and not (entry / "tokenizer.json").is_file():
        raise LaunchError(f"entry model {plan['entry']!r}: no tokenizer.json in {entry}")


def check_vocab(plan: dict[str, Any]) -> None:
    """The models served share one tokenizer (`compiler.vocab`): checked again here, for a plan compiled
    elsewhere or whose model folders changed since."""
    from tokenrouter.compiler.vocab import vocab_problems

    names = sorted(plan["models"], key=lambda name: name != plan["entry"])
    problems = vocab_problems({name: plan["models"][name]["path"] for name in names})
    if problems:
        raise LaunchError(problems[0][1])


def check_port(host: str, port: int) -> None:
    """Fail before loading any model when the HTTP port is taken (the frontend still reports a later race)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise LaunchError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """What to tell a user who serves on an address other hosts can reach without an API key (None: nothing)."""
    import ipaddress

    if api_key or host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host.strip("[]")).is_loopback:
            return None
    except ValueError:
        pass  # a host name: it may resolve to anything
    return (
        f"--host {host} without --api-key: anyone who can reach this port can use the models "
        "(set --api-key or TOKENROUTER_API_KEY)"
    )


def check_device(device: str | None) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise LaunchError("--device cuda: no CUDA device is available here (use --device cpu)")


def make_endpoints(
    models: list[str], run_dir: Path, tcp: bool, bind_host: str = "127.0.0.1", remote: dict | None = None
) -> Endpoints:
    """ipc:// files in run_dir, or tcp:// on free ports of bind_host; a remote model's is tcp://HOST:PORT."""
    remote = remote or {}
    if not tcp:
        return Endpoints.ipc(models, str(run_dir))
    local = [x for x in models if x not in remote]
    try:
        ports = _free_ports(2 + len(local), bind_host)
    except OSError as e:
        raise LaunchError(f"--bind-host {bind_host}: cannot bind there: {e.strerror or e}") from None
    subservers = {x: tcp_url(bind_host, p) for x, p in zip(local, ports[2:], strict=True)}
    subservers.update({x: f"tcp://{remote[x]}" for x in models if x in remote})
    return Endpoints(
        launcher=tcp_url(bind_host, ports[0]),
        frontend=tcp_url(bind_host, ports[1]),
        subservers={x: subservers[x] for x in models},
        key=new_key(),  # CURVE: only the deployment's own processes are heard (ipc.secure_context)
    )


def _free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    socks = []
    host = host.strip("[]")
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# ---- child processes ---------------------------------------------------------------------------------------


def _child_main(fn, args, env: dict[str, str] | None = None) -> None:
    """Runs in each child: its own process group, and exit when the launcher is gone. `env` is set
    before anything in the child touches CUDA (an MPS client reads its settings when its context starts)."""
    os.environ.update(env or {})
    os.setpgrp()
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    code = 0
    try:
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


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


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
            print(f"tokenrouter: warning: {warning}", file=sys.stderr, flush=True)
        models = list(plan["models"])
        unknown = [x for x in cfg.remote if x not in plan["models"]]
        if unknown:
            raise LaunchError(
                f"--remote {unknown[0]}: no such model in the plan (models: {', '.join(models)})"
            )
        self.endpoints = make_endpoints(models, self.run_dir, cfg.tcp, cfg.bind_host, cfg.remote)
        if self.setup.lockstep:  # one process serves every model: every model's address is the entry's
            entry = self.endpoints.subservers[plan["entry"]]
            self.endpoints.subservers = {x: entry for x in models}
        self.ctx = zmq.Context()
        self.auth = secure_context(self.ctx, self.endpoints.key)
        self.inbox = Receiver(self.ctx, self.endpoints.launcher, m.ToLauncher)
        self.to_frontend = Sender(self.ctx, self.endpoints.frontend)
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
        print(f"tokenrouter: serving {plan['policy']['name']!r} ({', '.join(models)}) at {url}", flush=True)
        failure = self._supervise()
        if failure is None:
            return 0
        print(f"error: {failure}; shut down (failed processes are not restarted)", file=sys.stderr)
        return 1

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
        import multiprocessing as mp

        from tokenrouter.compiler.plan import co_runners
        from tokenrouter.runtime.frontend.config import FrontendArgs
        from tokenrouter.runtime.frontend.process import run_frontend_process
        from tokenrouter.runtime.subserver.busy_board import create_board
        from tokenrouter.runtime.subserver.process import SubserverArgs, run_subserver_process

        cfg = self.cfg
        spawn = mp.get_context("spawn")
        eps = self.endpoints.to_dict()
        caps = [s["max_len"] for s in plan["models"].values() if s.get("max_len")]
        extra = {**self.setup.engine_overrides, "prefix_cache": cfg.prefix_cache, **cfg.extra_subserver}
        board = None  # models sharing a GPU: who is in a step when (TokenRouter's own scheduler only)
        if (
            not self.setup.lockstep
            and self.setup.scheduler == "tokenrouter"
            and any(co_runners(plan).values())
        ):
            board = str(create_board(self.run_dir / "busy-board", len(plan["models"])))
        for name in plan["models"]:
            if self.setup.lockstep and name != plan["entry"]:
                continue  # the entry's process drives every model
            if name in cfg.remote:
                continue  # started by hand on its host (_print_remote_commands)
            device = None
            if cfg.device == "cpu":
                device = "cpu"
            # --device cuda: None = the model's own `gpu:`, which the subserver checks against the visible GPUs
            args = SubserverArgs(
                plan_path=plan_path,
                model=name,
                endpoints=eps,
                device=device,
                log_level=cfg.log_level.upper(),
                extra=dict(extra),
                scheduler=self.setup.scheduler,
                busy_board=board,
                cpu_threads=cfg.cpu_threads,
            )
            target = run_subserver_process
            if self.setup.lockstep:
                from tokenrouter.runtime.baselines.lockstep import run_lockstep_process as target
            self.procs[name] = spawn.Process(
                target=_child_main, args=(target, args, self._child_env(name)), name=f"tokenrouter-{name}"
            )
        from tokenrouter.compiler.plan import routing_digest

        fargs = FrontendArgs(
            policy=plan["policy"]["name"],
            entry=plan["entry"],
            models=list(plan["models"]),
            model_dir=plan["models"][plan["entry"]]["path"],
            endpoints=eps,
            host=cfg.host,
            port=cfg.port,
            api_key=cfg.api_key,
            run_dir=str(self.run_dir),
            max_len=min(caps) if caps else None,
            log_level=cfg.log_level.lower(),
            remote=list(cfg.remote),
            heartbeat_timeout_s=cfg.heartbeat_timeout_s,
            liveness_timeout_s=cfg.liveness_timeout_s,
            max_body_bytes=int(cfg.max_body_mib * (1 << 20)),
            body_timeout_s=cfg.body_timeout_s,
            routing=routing_digest(plan),
            profile_dir=cfg.profile_dir,
        )
        self.procs["frontend"] = spawn.Process(
            target=_child_main, args=(run_frontend_process, fargs), name="tokenrouter-frontend"
        )
        self._start_mps(plan, [x for x in self.procs if x != "frontend"])
        for name, p in self.procs.items():
            p.start()
            if name != "frontend":
                print(f"tokenrouter: model {name}: starting (pid {p.pid})", file=sys.stderr, flush=True)

    def _child_env(self, model: str) -> dict[str, str]:
        env = {}
        if (pct := self.cfg.mps_sm.get(model)) is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
        if model in self.cfg.mps_low:  # MPS client priority 1 = below normal (0, normal, is the default)
            env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
        return env

    def _start_mps(self, plan: dict, local: list[str]) -> None:
        from tokenrouter.runtime.mps import MpsDaemon, shared_gpus

        cfg = self.cfg
        for flag, names in (("--mps-sm", cfg.mps_sm), ("--mps-low", cfg.mps_low)):
            unknown = [x for x in names if x not in plan["models"]]
            if unknown:
                raise LaunchError(
                    f"{flag} {unknown[0]}: no such model in the plan (models: {', '.join(plan['models'])})"
                )
        shared = shared_gpus(plan, local) if cfg.device != "cpu" else []
        needed = bool(cfg.mps_sm or cfg.mps_low)  # the flags that only MPS carries out
        if cfg.mps == "off" or (cfg.mps == "auto" and not shared and not needed):
            return
        self.mps = MpsDaemon(self.run_dir)
        why = self.mps.start()
        if why is None:
            log.info("CUDA MPS started for the subservers (%s)", self.mps.pipe)
        elif cfg.mps == "on" or needed:
            raise LaunchError(f"--mps {'on' if cfg.mps == 'on' else 'for --mps-sm / --mps-low'}: {why}")
        elif shutil.which("nvidia-smi"):  # a GPU machine: say what sharing without MPS costs
            print(f"tokenrouter: warning: subservers share GPU {shared} without CUDA MPS ({why}); their "
                  "kernels will time-slice instead of running together (docs/serving.md)", file=sys.stderr)  # fmt: skip

    def remote_command(self, model: str) -> str:
        """The command that starts a remote model's subserver on its host (the plan copied to the same path)."""
        import shlex

        cmd = ["tokenrouter", "subserver", self.cfg.plan, "--model", model]
        cmd += ["--endpoints", json.dumps(self.endpoints.to_dict(), separators=(",", ":"))]
        if self.cfg.device is not None:
            cmd += ["--device", self.cfg.device]
        cmd += ["--log-level", self.cfg.log_level]
        if not self.cfg.prefix_cache:
            cmd += ["--no-prefix-cache"]
        return shlex.join(cmd)

    def _print_remote_commands(self) -> None:
        for model in self.cfg.remote:
            print(
                f"tokenrouter: waiting for remote subserver {model!r} at {self.endpoints.subservers[model]}; "
                f"start it on that host (with the plan and model folders copied there) with:\n"
                f"  {self.remote_command(model)}",
                file=sys.stderr,
                flush=True,
            )

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
            for msg in self._drain():
                if isinstance(msg, m.Fatal):
                    return f"{_what(msg.name)} failed to start: {_last_line(msg.error)}"
                self._on_ready(msg)
            for name, p in self.procs.items():
                if name not in self.ready and not p.is_alive():
                    for msg in self._drain():  # a Fatal may be on its way
                        if isinstance(msg, m.Fatal):
                            return f"{_what(msg.name)} failed to start: {_last_line(msg.error)}"
                        self._on_ready(msg)
                    return f"{_what(name)} {_exit_text(p.exitcode)} during startup"
            if time.monotonic() > deadline:
                late = [repr(x) for x in self.procs if x not in self.ready]
                late += [
                    f"remote subserver {x!r} (no Ready from {self.endpoints.subservers[x]}: was "
                    "`tokenrouter subserver` started on its host, and can it reach --bind-host?)"
                    for x in self.cfg.remote
                    if x not in self.ready
                ]
                return f"not ready after {self.cfg.startup_timeout_s:g} s: {', '.join(late)}"
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
                return f"the frontend {_exit_text(self.procs['frontend'].exitcode)} during startup"
            if time.monotonic() > deadline:
                return f"the frontend's /health was not 200 after {self.cfg.startup_timeout_s:g} s"
            time.sleep(0.02)
        return None

    def _on_ready(self, msg: m.Ready | m.Progress) -> None:
        """A Ready (forwarded to the frontend; a model's ready line printed), or a Progress before it (printed)."""
        if isinstance(msg, m.Progress):
            print(f"tokenrouter: model {msg.name}: {msg.detail}", file=sys.stderr, flush=True)
            return
        if msg.name != "frontend":
            where = msg.info.get("device", "?")
            print(f"tokenrouter: model {msg.name}: ready on {where}", file=sys.stderr, flush=True)
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
            failed: tuple[str, str] | None = None
            for msg in self._drain():
                if isinstance(msg, m.Fatal) and failed is None:
                    failed = (msg.name, _last_line(msg.error))
            if failed is None:
                for name, p in self.procs.items():
                    if not p.is_alive():
                        failed = (name, _exit_text(p.exitcode))
                        break
            if failed is not None:
                name, detail = failed
                self.failed = name
                self.to_frontend.send(m.Fatal(name=name, error=detail))
                time.sleep(FAIL_GRACE_S)
                return f"{_what(name)} failed: {detail}"
        return None

    def _shutdown(self) -> None:
        """Stop every child (gently, then by force) and whatever it left in its process group, close sockets,
        remove the run directory. Idempotent."""
        if self.ctx is not None:
            for name, addr in self.endpoints.subservers.items():
                local = self.procs.get(name) is not None and self.procs[name].is_alive()
                if name in self.ready and (local or name in self.cfg.remote):
                    s = self.ctx.socket(zmq.PUSH)
                    s.setsockopt(zmq.LINGER, 500)
                    s.connect(addr)
                    try:
                        s.send(msgspec.msgpack.encode(m.Shutdown()), zmq.NOBLOCK)
                    except zmq.Again:
                        pass
                    s.close()
        failed = self.procs.get(self.failed)
        if failed is not None and failed.pid is not None and failed.is_alive():
            failed.kill()  # it failed while alive (frozen, stuck): it would answer neither Shutdown nor SIGTERM
        for name, p in self.procs.items():  # the frontend, and any process still loading: SIGTERM
            if p.pid is not None and p.is_alive() and (name == "frontend" or name not in self.ready):
                p.terminate()
        started = {name: p for name, p in self.procs.items() if p.pid is not None}
        for name in _wait_exits(started, JOIN_TIMEOUT_S):
            log.warning("%s did not stop in time; killing it", _what(name))
            started[name].kill()
        for p in started.values():
            # what a child started and left behind (its process group is its pid: `_child_main`); killed
            # before `join` reaps the child, so that the group's number is still the child's
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.join(5.0)
        if started and all(p.exitcode is not None for p in started.values()):
            _stop_resource_tracker()
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


def _wait_exits(procs: dict[str, Any], timeout_s: float) -> list[str]:
    """Wait until every process of `procs` (name → started multiprocessing.Process) has exited or `timeout_s`
    has passed, without reaping any; the names of those still running."""
    from multiprocessing.connection import wait

    deadline = time.monotonic() + timeout_s
    running = {p.sentinel: name for name, p in procs.items()}
    while running and (left := deadline - time.monotonic()) > 0:
        for sentinel in wait(list(running), left):
            del running[sentinel]
    return list(running.values())


def _stop_resource_tracker() -> None:
    """Stop multiprocessing's resource tracker, a process in the launcher's group that starting the children
    started: it exits only once every process holding its pipe has, which would be after the launcher."""
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # CPython 3.8 on
    if stop is not None:
        with contextlib.suppress(Exception):
            stop()


def _what(name: str) -> str:
    return "the frontend" if name == "frontend" else f"subserver {name!r}"


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else "unknown error"


def serve(cfg: ServeConfig) -> int:
    """Run a deployment until a signal or a failure; the process exit status."""
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s launcher %(levelname)s %(message)s")
    return Launcher(cfg).run()
