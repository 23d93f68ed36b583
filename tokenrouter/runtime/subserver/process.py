"""One model subserver as an OS process: `run_subserver_process(SubserverArgs(...))`.

Start it with `multiprocessing` (spawn) or any process launcher, one per model of the plan. It

1. loads the plan, the model's engine (device: `args.device`, else `cuda:<first of the model's gpus>` when
   CUDA is available, else `cpu`) and its route kernel, sending the launcher a `Progress` as each phase is
   done (torch imported, weights loaded, KV pool, CUDA graphs captured, kernels warmed);
2. binds its PULL socket at `endpoints["subservers"][model]` and connects PUSH sockets to the frontend and
   to every peer subserver;
3. sends `Ready(name=model, info={"model", "device", "pid", "vocab_size", "max_len", "eos_token_ids"})` to the
   launcher;
4. runs until it receives `Shutdown` (or SIGTERM/SIGINT), then returns normally (exit status 0).
On any crash, during loading or later, it logs the traceback and sends `Fatal(name=model, error=<traceback>)`
to the launcher *and* to the frontend (so the frontend can fail that model's in-flight requests at once),
then exits with status 1.

What it expects from the frontend (see `tokenrouter.runtime.messages`): `NewRequest` to the plan's entry
model only, with `n_active` = the active requests including the new one; `ActiveCount` to *every* subserver
whenever n changes (on arrival, finish, abort) — delayed batching depends on it; `Release(rid)` to every
subserver after a `Finished`; `Abort(rid)` to every subserver when a client goes away; `Shutdown` to stop.
What it sends to the frontend: `StepOutputs` (per step: `TokenOut` per committed token, with `index` = the
token's index among the request's generated tokens and `model` = who wrote it; `hop_to` set when the request
left for another model after that token; a `TokenOut` with empty `token_ids` and `hop_to` set for a `drop`
hop, which commits nothing; `Finished` from the model that committed the last token, or with reason
"error" and a message when a request cannot run), and `SubserverStats` every `stats_interval_s`.

One loop, in the main thread, owns every socket: it waits on the PULL socket (frontend messages and peers'
`PeerRequest`s) at most until the scheduler may run, applies the messages to the `Scheduler`, runs a step
whenever delayed batching allows (schedule → forward → route kernel → commit/hop/finish), and sends the step's
outputs and hops straight from its PUSH sockets (a step's hops to one peer as one `PeerBatch`: `messages.pack_hops`). Those
have no high-water mark, so a slow or absent peer (or frontend) never blocks a step: ZeroMQ's own I/O thread
queues and delivers. (An IO thread that receives and another that sends, with queues between them and the
decode loop, made a hop take 0.7-1.3 ms on the H200 from the sender's step end to the receiver's scheduler,
which the throughput model does not see: docs/runtime.md.)
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
import traceback

import msgspec
import zmq

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.ipc import Endpoints, Receiver, Sender, secure_context
from tokenrouter.runtime.subserver.args import SubserverArgs
from tokenrouter.runtime.subserver.loading import load_model_runtime, pick_device
from tokenrouter.runtime.subserver.outbox import FRONTEND, Outbox
from tokenrouter.runtime.subserver.profiling import LiveProfiler
from tokenrouter.runtime.threads import threads_per_model, usable_cores

logger = logging.getLogger(__name__)
_encoder = msgspec.msgpack.Encoder()


def threads_per_subserver(models: int, cores: int | None = None) -> int:
    """Torch intra-op threads for each of a plan's `models` subservers (`runtime.threads`, which says why)."""
    return threads_per_model(models, cores if cores is not None else usable_cores())


class Subserver:
    """One subserver process: its decode loop and the sockets the loop owns. `report(model, phase, detail)`,
    where given, hears of each phase of a model's start-up as it is done (`messages.Progress`)."""

    def __init__(self, args: SubserverArgs, ctx: zmq.Context, report=None) -> None:
        from tokenrouter.compiler.plan import read_plan

        self.args = args
        self.ctx = ctx
        self.report = report
        self.model = args.model
        self.endpoints = Endpoints.from_dict(args.endpoints)
        self.plan = read_plan(args.plan_path)
        if self.model not in self.plan["models"]:
            raise ValueError(f"model {self.model!r} is not in plan {args.plan_path}")
        self.import_torch()
        self.device = pick_device(self.plan["models"][self.model], args.device, args.require_cuda)
        self.init_threads_per_process()
        self.init_scheduler()
        self.profiler = LiveProfiler(self.model, self.device)
        self.stop = threading.Event()
        self.init_sockets()

    def init_scheduler(self) -> None:
        """`self.engine` and `self.scheduler` (the lockstep baseline overrides this: runtime/baselines/lockstep.py)."""
        args = self.args
        if args.scheduler == "std-serving":  # the baseline of runtime/baselines/std_serving.py
            from tokenrouter.runtime.baselines.std_serving import load_std_serving

            self.engine, self.scheduler = load_std_serving(
                self.plan,
                self.model,
                self.device,
                args.extra,
                max_batch=args.max_batch,
                progress=self.progress(self.model),
            )
        else:
            from tokenrouter.runtime.subserver.scheduler import Scheduler

            self.engine, kernel = load_model_runtime(
                self.plan,
                self.model,
                self.device,
                warm_rows=args.max_batch,
                progress=self.progress(self.model),
                **args.extra,
            )
            self.scheduler = Scheduler(self.model, self.plan, self.engine, kernel, max_batch=args.max_batch)
            self.scheduler.recorder.board = self.attach_board()

    def progress(self, model: str):
        """The `progress(phase, detail)` of one model's loading: `report` with the model's name, or None."""
        if self.report is None:
            return None
        return lambda phase, detail: self.report(model, phase, detail)

    def attach_board(self):
        """This model's place on the launcher's busy board, where another model shares one of its GPUs."""
        from tokenrouter.compiler.plan import co_runners
        from tokenrouter.runtime.subserver.busy_board import BusyBoard

        beside = co_runners(self.plan).get(self.model)
        if not self.args.busy_board or not beside:
            return None
        order = list(self.plan["models"])
        return BusyBoard(self.args.busy_board, order.index(self.model), tuple(order.index(x) for x in beside))

    def import_torch(self) -> None:
        """The process's first import of torch (seconds on a busy machine), reported as a phase of its own."""
        start = time.perf_counter()
        import torch

        if self.report is not None:
            took = time.perf_counter() - start
            self.report(self.model, "torch", f"torch {torch.__version__} imported in {took:.1f} s")

    def init_threads_per_process(self) -> None:
        """Subservers share the host's cores, on CPU and on GPU alike: each gets `threads_per_subserver`
        torch threads unless `cpu_threads` says otherwise."""
        import torch

        threads = self.args.cpu_threads or threads_per_subserver(len(self.plan["models"]))
        torch.set_num_threads(
            threads
        )  # not set_torch_threads: serve's count stands, whatever OMP_NUM_THREADS says
        logger.info("model %s: %d torch thread(s)", self.model, threads)

    def init_sockets(self) -> None:
        """The PULL socket at this model's address, and PUSH sockets to the frontend and to every peer, all
        owned by the decode loop. No high-water mark: a slow or absent receiver never blocks a send (ZeroMQ
        queues the messages; the launcher, which watches its processes, shuts a deployment with a dead
        subserver down)."""
        self.pull = Receiver(self.ctx, self.endpoints.subservers[self.model], m.ToSubserver, unbounded=True)
        self.to_frontend = Sender(self.ctx, self.endpoints.frontend, unbounded=True)
        self.to_peers = {
            name: Sender(self.ctx, addr, unbounded=True)
            for name, addr in self.endpoints.subservers.items()
            if name != self.model
        }

    def info(self) -> dict:
        from tokenrouter.runtime.subserver.route_inputs import rule_texts  # torch: imported by `import_torch`

        i = self.engine.info
        return {
            "model": self.model,
            "device": self.device,
            "pid": os.getpid(),
            "vocab_size": i.vocab_size,
            "max_len": i.max_len,
            "eos_token_ids": list(i.eos_token_ids),
            "scores_prompts": i.scores_prompts,  # echo with logprobs (engine/scoring.py)
            "route_rules": rule_texts(self.plan["routes"].get(self.model) or {}),  # for the playground
        }

    # ---- the decode loop ---------------------------------------------------------------------------------

    def event_loop(self) -> None:
        next_stats = time.monotonic()
        while not self.stop.is_set():
            for msg in self._receive():
                if isinstance(msg, m.Shutdown):
                    self.stop.set()
                    break
                if isinstance(msg, m.Profile):
                    self.dispatch([(FRONTEND, self.profiler.handle(msg))])
                    continue
                self.dispatch(self.scheduler.handle(msg))
            if self.stop.is_set():
                break
            if self.scheduler.ready():
                self.dispatch(self.scheduler.step())
            if time.monotonic() >= next_stats:
                self.dispatch([(FRONTEND, self.scheduler.stats())])
                next_stats = time.monotonic() + self.args.stats_interval_s

    def _receive(self) -> list:
        """The messages queued on the PULL socket, after waiting for one at most until the scheduler may run
        (not at all when it can run now)."""
        if not self.scheduler.ready():
            deadline = self.scheduler.next_deadline()
            timeout = self.args.stats_interval_s if deadline is None else deadline - time.monotonic()
            timeout = min(max(timeout, 0.0), self.args.stats_interval_s)
            if timeout > 0:
                self.pull.poll(max(1, math.ceil(timeout * 1000.0)))
        return m.unpack_hops(self.pull.drain())

    def dispatch(self, out: Outbox) -> None:
        for dest, msg in m.pack_hops(out):
            data = _encoder.encode(msg)
            (self.to_frontend if dest == FRONTEND else self.to_peers[dest]).sock.send(data)

    def close(self) -> None:
        self.stop.set()
        for sock in (getattr(self, "pull", None), getattr(self, "to_frontend", None),
                     *getattr(self, "to_peers", {}).values()):  # fmt: skip
            if sock is not None:
                sock.sock.close(0)
        recorder = getattr(getattr(self, "scheduler", None), "recorder", None)  # none: the lockstep baseline
        board = getattr(recorder, "board", None)
        if board is not None:
            board.close()


def user_errors() -> tuple[type[BaseException], ...]:
    """The errors that say what is wrong with the user's input, not with the code: a subserver that cannot start
    for one of these reports its message alone."""
    from tokenrouter.compiler.plan import PlanError
    from tokenrouter.runtime.engine.config import ModelFolderError
    from tokenrouter.runtime.route.routers import RouterFileError

    return (ModelFolderError, RouterFileError, PlanError)


def run_subserver_process(args: SubserverArgs) -> None:
    """The entry function of one subserver process (see the module docstring for the protocol)."""
    run_server_process(args, f"subserver[{args.model}]", Subserver, lambda sub: {args.model: sub.info()})


def run_server_process(args: SubserverArgs, label: str, make_server, infos) -> None:
    """The life of a process that serves models: build `make_server(args, ctx, report)` (it calls
    `report(model, phase, detail)` as each phase of a model's start-up is done: a `Progress` to the launcher),
    send one `Ready` per model (`infos(server)`: model -> info), run its event loop until Shutdown or
    SIGTERM/SIGINT; on a crash, log the traceback and send `Fatal` to the launcher and the frontend, and exit 1.
    Progress, Ready and Fatal leave on one socket, so the launcher gets them in order."""
    logging.basicConfig(level=args.log_level.upper(), format=f"%(asctime)s %(levelname)s {label} %(message)s")
    ctx = zmq.Context()
    auth = secure_context(ctx, args.endpoints.get("key"))
    launcher = Sender(ctx, args.endpoints["launcher"])
    frontend = Sender(ctx, args.endpoints["frontend"])
    sub = None
    code = 0
    try:
        sub = make_server(
            args, ctx, lambda model, phase, detail: launcher.send(m.Progress(model, phase, detail))
        )
        _serve(args, sub, launcher, infos)
    except BaseException as exc:
        _send_fatal(args, exc, started=sub is not None, to=(launcher, frontend))
        code = 1
    finally:
        if sub is not None:
            sub.close()
        # each socket's own LINGER: 0 after a clean run; 2 s after a crash, so that the queued Fatal still
        # reaches its peer (a close(0) here dropped it before ZeroMQ had sent it: CI saw a missing
        # plan file's Fatal never arrive)
        launcher.sock.close()
        frontend.sock.close()
        if auth is not None:
            auth.stop()
        ctx.term()
    if code:
        raise SystemExit(code)


def _serve(args: SubserverArgs, sub, launcher: Sender, infos) -> None:
    """Stop on SIGTERM/SIGINT, say Ready for each model, and run the event loop."""

    def _stop(signum, frame):  # SIGTERM/SIGINT: leave the loop at the next iteration
        sub.stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    for name, info in infos(sub).items():
        launcher.send(m.Ready(name=name, info=info))
    logger.info("ready on %s (%s)", sub.device, args.endpoints["subservers"][args.model])
    sub.event_loop()


def _send_fatal(args: SubserverArgs, exc: BaseException, started: bool, to: tuple[Sender, ...]) -> None:
    """Log the crash and tell the launcher and the frontend (`Fatal`)."""
    tb = traceback.format_exc()
    if not started and isinstance(exc, user_errors()):
        # the user's mistake (a model folder, a router file, the plan): the launcher prints its message as
        # the one line `error: … failed to start: …`; the traceback only at debug level
        logger.debug("could not start:\n%s", tb)
        error = str(exc)
    else:
        logger.error("crashed:\n%s", tb)
        error = tb
    for s in to:
        s.sock.setsockopt(zmq.LINGER, 2000)  # deliver the Fatal even though we are exiting
        s.send(m.Fatal(name=args.model, error=error))
