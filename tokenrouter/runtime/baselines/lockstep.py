"""The `lockstep` baseline: how the algorithms' reference code serves token routing.

One process holds every model and drives them synchronously, one global step at a time: the entry model
(the small one) runs on every request it holds, then each other model, in plan order, runs on the rows
routed to it in that same step; hops are delivered in memory at once, so a row the small model hands over
is written by the large model before the next global step. No model runs while another does, no delayed
batching (each model's threshold is 1), and the process loops are those of a subserver.

`LockstepCore` has the shape of a `Scheduler` (`handle`, `ready`, `next_deadline`, `step`, `stats`), so the
subserver's decode loop (`subserver/process.py`) drives it unchanged; it reuses the
schedulers' routing, so under greedy decoding its tokens and per-token model trace equal TokenRouter's.
The launcher maps every model's endpoint to this one process; `Release`, `Abort` and `ActiveCount`
therefore arrive once per model and are applied to every scheduler (the repeats are no-ops).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable

import msgspec

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.engine.base import Engine
from tokenrouter.runtime.engine.embedded import device_scope
from tokenrouter.runtime.subserver.batching import BatchingConfig
from tokenrouter.runtime.subserver.process import Subserver, SubserverArgs, run_server_process
from tokenrouter.runtime.subserver.scheduler import FRONTEND, Outbox, Scheduler

logger = logging.getLogger(__name__)


class LockstepCore:
    def __init__(
        self,
        plan: dict,
        engines: dict[str, Engine],
        kernels: dict[str, Callable],
        *,
        clock: Callable[[], float] = time.monotonic,
        max_batch: int = 256,
    ) -> None:
        self.model = plan["entry"]
        self.order = [self.model, *(x for x in plan["models"] if x != self.model)]
        every_step = BatchingConfig({x: 1 for x in plan["models"]}, max_delay_ms=0.0)
        self.schedulers = {
            x: Scheduler(
                x, plan, engines[x], kernels[x], batching=every_step, clock=clock, max_batch=max_batch
            )
            for x in self.order
        }
        self.devices = {x: getattr(engines[x], "device", None) for x in self.order}  # made current per call
        self.steps = 0
        self._stats_turn = 0

    def handle(self, msg: msgspec.Struct) -> Outbox:
        if isinstance(msg, m.NewRequest):
            return self._deliver(self._on(self.model, self.schedulers[self.model].handle, msg))
        out: Outbox = []
        for name in self.order:
            out += self._deliver(self._on(name, self.schedulers[name].handle, msg))
        return out

    def ready(self) -> bool:
        return any(s.runnable for s in self.schedulers.values())

    def next_deadline(self) -> float | None:
        return None  # ready() is true whenever any request is runnable

    def step(self) -> Outbox:
        """One global step: each model in turn (entry first) on every row runnable on it now."""
        out: Outbox = []
        for name in self.order:
            s = self.schedulers[name]
            if s.runnable:
                out += self._deliver(self._on(name, s.step))
        self.steps += 1
        return out

    def _deliver(self, outbox: Outbox) -> Outbox:
        """Hand peer messages to their schedulers now; return what goes to the frontend."""
        to_frontend: Outbox = []
        todo = deque(outbox)
        while todo:
            dest, msg = todo.popleft()
            if dest == FRONTEND:
                to_frontend.append((dest, msg))
            else:
                todo.extend(self._on(dest, self.schedulers[dest].handle, msg))
        return to_frontend

    def _on(self, name: str, fn: Callable, *args):
        """`fn(*args)` with model `name`'s GPU current: Triton launches on, and CUDA graphs replay from, the
        current device, and with one model per GPU this process steps engines on two of them."""
        with device_scope(self.devices[name]):
            return fn(*args)

    def stats(self) -> m.SubserverStats:
        """One model's stats per call, in turn (the decode loop sends one report per interval)."""
        name = self.order[self._stats_turn % len(self.order)]
        self._stats_turn += 1
        return self.schedulers[name].stats()


class LockstepServer(Subserver):
    """A subserver process whose scheduler is a `LockstepCore` over every model of the plan. Each forward
    gets the torch threads a subserver gets (`threads_per_subserver`, inherited): more, with the frontend
    and the clients on the same cores, spin-waits and runs many times slower on CPU."""

    def init_scheduler(self) -> None:
        """Every model's engine and kernel in this process, driven by one LockstepCore. `args.model` is
        the plan's entry (the launcher starts this process under the entry's name)."""
        from tokenrouter.runtime.subserver.loading import load_model_runtime, pick_device

        args = self.args
        if self.model != self.plan["entry"]:
            raise ValueError(f"the lockstep process runs as the entry model {self.plan['entry']!r}")
        self.devices = {
            x: pick_device(spec, args.device, args.require_cuda) for x, spec in self.plan["models"].items()
        }
        engines, kernels = {}, {}
        for x in self.plan["models"]:
            engines[x], kernels[x] = load_model_runtime(
                self.plan,
                x,
                self.devices[x],
                warm_rows=args.max_batch,
                progress=self.progress(x),
                **args.extra,
            )
        self.engines = engines
        self.engine = engines[self.model]
        self.scheduler = LockstepCore(self.plan, engines, kernels, max_batch=args.max_batch)

    def infos(self) -> dict[str, dict]:
        out = {}
        for x, e in self.engines.items():
            i = e.info
            out[x] = {
                "model": x,
                "device": self.devices[x],
                "pid": os.getpid(),
                "vocab_size": i.vocab_size,
                "max_len": i.max_len,
                "eos_token_ids": list(i.eos_token_ids),
                "scores_prompts": i.scores_prompts,  # the entry model's Scheduler scores prompts as a subserver's
                "mode": "lockstep",
            }
        return out


def run_lockstep_process(args: SubserverArgs) -> None:
    """The entry function of the lockstep process: as `run_subserver_process`, with a `Ready` per model."""
    run_server_process(args, "lockstep", LockstepServer, LockstepServer.infos)
