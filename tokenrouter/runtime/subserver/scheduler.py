"""The subserver's scheduler: a transport-agnostic core (no sockets, no threads).

`Scheduler(model, plan, engine, route_kernel)` holds the requests this model knows. Its owner (the process's
decode loop, or the in-process executor) feeds it messages with `handle(msg)` and calls `step()` when
`ready()`; both return the outbound messages as `(destination, message)` pairs, where destination is
`FRONTEND` or a peer model's name. One step:

    get_next_batch_to_run()  -> runnable requests (delayed batching decides whether it is time)
    run_batch(batch)         -> engine.forward over each row's unseen tokens (prefill on a first visit,
                                extend on a return, decode otherwise)
    route_batch(rows, step)  -> the route kernel (sample + rules)
    process_batch_result()   -> per row: commit / hop (keep | drop | for K) / finish

Its accounting (timings, counters, step shapes) lives beside it in `StepRecorder` (recorder.py).

Outputs to the frontend: one `StepOutputs` per step with a `TokenOut` per committed token (`hop_to` set when
the step also handed the request to another model) and a `TokenOut` with *no* tokens for a `drop` hop (the
sampled token was discarded, only the hand-off is reported); `Finished` when this subserver committed the
last token (EOS / stop token → "stop", max_tokens or the context end → "length") or could not run it
("error"). The subserver that finishes a request frees its own KV at once; the others free theirs on
`Release`/`Abort`. A request with sampling.prompt_logprobs has its prompt scored in its first step on the entry
model (`PromptLogprobs`, subserver/logprobs.py); with max_tokens 0 it then finishes ("length") without a token.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import torch

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.engine.base import Engine, EngineError, StepInput, StepOutput
from tokenrouter.runtime.grammar import Grammars
from tokenrouter.runtime.route import RouteBatchState
from tokenrouter.runtime.route.kernel import RouteResult
from tokenrouter.runtime.route.state import RouteStatePacker
from tokenrouter.runtime.sampling import DEFAULT_SAMPLER
from tokenrouter.runtime.subserver.batching import BatchingConfig, DelayedBatching
from tokenrouter.runtime.subserver.logprobs import (
    note_logprobs,
    prompt_outputs,
    score_k,
    take_prompt_logprobs,
)
from tokenrouter.runtime.subserver.outbox import FRONTEND, Outbox
from tokenrouter.runtime.subserver.profiling import region
from tokenrouter.runtime.subserver.recorder import StepRecorder
from tokenrouter.runtime.subserver.req import Req, ReqStatus
from tokenrouter.runtime.subserver.route_inputs import note_route_inputs, token_inputs, wanted

logger = logging.getLogger(__name__)

TOMBSTONES = 100_000  # rids remembered after they end, so late peer messages for them are dropped


@dataclass(slots=True, frozen=True)
class Hop:
    """A hand-off: a rule's action (`-> target [drop] [for K]`), or the return at the end of a `for K` visit."""

    target: str
    drop: bool = False
    for_k: int = 0


class Scheduler:
    def __init__(
        self,
        model: str,
        plan: dict,
        engine: Engine,
        route_kernel: Callable,
        *,
        batching: BatchingConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_batch: int = 256,
    ) -> None:
        if model not in plan["models"]:
            raise ValueError(f"model {model!r} is not in the plan (models: {', '.join(plan['models'])})")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model = model
        self.engine = engine
        # the most tokens a row can hold (fit_kv's quick check: a pool this free holds any batch); an engine that
        # does not say gets the exact check every step
        self._max_len = getattr(engine, "max_len", None) or 1 << 62
        self.kernel = route_kernel
        self.clock = clock
        self.max_batch = max_batch
        self._packer: RouteStatePacker | None = None  # the route state's buffers, made on the first step
        self.init_routes(plan)
        self.init_queues()
        self.batching = DelayedBatching(batching or BatchingConfig.from_plan(plan), model)
        self._handlers = {
            m.NewRequest: self.handle_new_request,
            m.PeerRequest: self.handle_peer_request,
            m.Release: self.handle_release,
            m.Abort: self.handle_release,
            m.ActiveCount: self.handle_active_count,
        }

    def init_routes(self, plan: dict) -> None:
        route = plan["routes"].get(self.model, {"rules": []})
        self.rules = [
            Hop(r["target"], bool(r.get("drop", False)), int(r.get("for") or 0)) for r in route["rules"]
        ]
        self.want_hidden = bool(getattr(self.kernel, "needs_hidden", True))
        self.eos = frozenset(self.engine.info.eos_token_ids)
        self.max_len = self.engine.info.max_len
        info, spec = self.engine.info, plan["models"][self.model]
        self.grammars = Grammars(spec.get("path"), info.vocab_size, tuple(info.eos_token_ids))

    def init_queues(self) -> None:
        self.reqs: dict[str, Req] = {}
        self.runnable: OrderedDict[str, Req] = OrderedDict()  # FIFO by ready_since
        self.ended: OrderedDict[str, None] = OrderedDict()  # tombstones
        self.recorder = StepRecorder(self.model)

    # ---- incoming messages -------------------------------------------------------------------------------

    def handle(self, msg: msgspec.Struct) -> Outbox:
        handler = self._handlers.get(type(msg))
        if handler is None:
            raise TypeError(f"subserver {self.model}: no handler for {type(msg).__name__}")
        return handler(msg)

    def handle_new_request(self, msg: m.NewRequest) -> Outbox:
        self.batching.set_active(msg.n_active, msg.count_seq)
        if msg.rid in self.reqs or msg.rid in self.ended:
            logger.warning("%s: duplicate or ended request %s ignored", self.model, msg.rid)
            return []
        if not msg.prompt_ids:
            return self._fail_new(msg.rid, "the prompt is empty")
        if len(msg.prompt_ids) >= self.max_len:
            return self._fail_new(
                msg.rid,
                f"the prompt has {len(msg.prompt_ids)} tokens; {self.model} accepts at most "
                f"{self.max_len - 1} before the first generated token",
            )
        now = self.clock()
        req = Req(
            msg.rid, list(msg.prompt_ids), len(msg.prompt_ids), msg.sampling, arrived_at=now, ready_since=now
        )
        req.seen_by[self.model] = len(req.tokens)
        req.score_prompt = msg.sampling.prompt_logprobs >= 0
        self._admit(req)
        return []

    def handle_peer_request(self, msg: m.PeerRequest) -> Outbox:
        if msg.sent_at > 0:
            self.recorder.count_hop_delay(msg.sent_at)
        if msg.count_seq:
            self.batching.set_active(msg.n_active, msg.count_seq)  # the later of the sender's count and ours
        elif 0 < msg.n_active < self.batching.n_active:
            self.batching.set_active(msg.n_active)  # unnumbered: a lower n is always safe
        if msg.rid in self.ended:
            return []  # aborted or released while the hop was in flight
        req = self.reqs.get(msg.rid)
        if req is None:
            req = Req(msg.rid, [], msg.prompt_len, msg.sampling)
            self.reqs[msg.rid] = req
        elif req.status != ReqStatus.PENDING:
            return self._fail(req, f"{self.model} received request {msg.rid} while it was {req.status.value}")
        error = self._continue_with(req, msg)
        if error is not None:
            return self._fail(req, error)
        req.run_length = 0
        req.for_left = msg.for_k
        req.return_to = msg.return_to if msg.for_k > 0 else None
        req.arrived_at = req.ready_since = self.clock()
        req.status = ReqStatus.WAITING
        self._admit(req)
        return []

    def _continue_with(self, req: Req, msg: m.PeerRequest) -> str | None:
        """Append the hop's tokens this subserver has not seen, and what every model has seen; or why not."""
        overlap = len(req.tokens) - msg.start
        if overlap < 0 or req.tokens[msg.start :] != msg.tokens[:overlap]:
            return (
                f"{self.model}: hop of {msg.rid} from {msg.origin} does not continue its sequence "
                f"(known {len(req.tokens)} tokens, got tokens from {msg.start})"
            )
        req.tokens.extend(msg.tokens[overlap:])
        if len(req.tokens) >= self.max_len:
            return f"request {msg.rid} has {len(req.tokens)} tokens, more than {self.model} accepts"
        for peer, n in msg.seen.items():
            req.seen_by[peer] = max(req.seen_by.get(peer, 0), n)
        req.seen_by[self.model] = len(req.tokens)
        return None

    def handle_release(self, msg: m.Release | m.Abort) -> Outbox:
        req = self.reqs.get(msg.rid)
        if req is not None:
            self._drop(req)
        else:
            self._tombstone(msg.rid)
        return []

    def handle_active_count(self, msg: m.ActiveCount) -> Outbox:
        self.batching.set_active(msg.n_active, msg.count_seq)
        return []

    # ---- one step ----------------------------------------------------------------------------------------

    def ready(self) -> bool:
        oldest = next(iter(self.runnable.values()), None)
        return self.batching.should_run(
            len(self.runnable), oldest.ready_since if oldest else None, self.clock(), len(self.reqs)
        )

    def next_deadline(self) -> float | None:
        """When the max_delay timeout makes `ready()` true (None: no runnable request or no timeout)."""
        oldest = next(iter(self.runnable.values()), None)
        return self.batching.deadline(oldest.ready_since if oldest else None)

    def step(self) -> Outbox:
        """schedule -> run -> route -> commit; the recorder times the step and counts what it ran."""
        batch = self.get_next_batch_to_run()
        if not batch:
            return []
        rec = self.recorder
        rec.begin(self.batching.start_reason(len(self.runnable), len(self.reqs)))
        try:
            rows, step, out = self.run_batch(batch)
            rows, result, failed = self.route_batch(rows, step)
            out += failed
            if rows:
                with region("commit"):
                    out += self.process_batch_result(rows, result)
        finally:
            rec.leave_board()
        sent_at = rec.end(len(rows))
        for _, msg in out:
            if isinstance(msg, m.PeerRequest):
                msg.sent_at = sent_at
        if self.ready():
            rec.mark_ready()
        return out

    def get_next_batch_to_run(self) -> list[Req]:
        if not self.ready():
            return []
        batch = []
        for req in self.runnable.values():
            batch.append(req)
            if len(batch) == self.max_batch:
                break
        batch = self.fit_kv(batch)
        late = self.engine.late_shared_prefills(
            [(r.rid, r.tokens) for r in batch if not self.engine.resident(r.rid)]
        )
        return [r for r in batch if r.rid not in late] if late else batch

    def _token_out(self, req: Req, tok: int, hop_to: str | None) -> m.TokenOut:
        """The frontend's record of a committed token (its logprobs and route inputs where asked)."""
        lp, why = (None if req.logprobs is None else [req.logprobs]), token_inputs(req)
        return m.TokenOut(
            req.rid, req.generated - 1, [tok], self.model, hop_to=hop_to, logprobs=lp, route_inputs=why
        )

    def _settle(
        self,
        req: Req,
        hop: Hop | None,
        reason: str | None,
        now: float,
        out: Outbox,
        finished: list[m.Finished],
    ) -> None:
        """After a committed token the request finishes (`reason`), hops, or stays runnable at the back."""
        if reason is not None:
            finished.append(m.Finished(req.rid, reason, self.model))
            self._drop(req)
        elif hop is not None:
            out.append(self._hop(req, hop))
        else:
            req.status = ReqStatus.RUNNING
            req.ready_since = now
            self.runnable.move_to_end(req.rid)

    def fit_kv(self, batch: list[Req]) -> list[Req]:
        """The rows of `batch` the KV pool holds without evicting anyone for a request that is not in it: every
        row whose KV is resident (its new tokens only), then, in order, the others (a first visit, or one
        evicted: its whole history) while the free slots and rows hold them; at least one row. The rest wait
        for a request to end (`kv_deferred_rows`). Without this, a step of more rows than the pool holds
        evicted some of them to run the others, and the next step the other way round: each step re-ran the
        prompts of a third of its rows (50 prompts of 1,000 tokens against a pool of 43,689 slots took 156 s
        instead of about 35). Where the engine does not say, or the pool holds every row at its longest, the
        batch is kept whole."""
        room = self.engine.kv_room()
        if room is None:
            return batch
        free, rows = room
        if free >= len(batch) * self._max_len and rows >= len(batch):
            return batch
        free, fresh = _without_resident(batch, free, self.engine.resident)
        if not fresh:
            return batch
        late = _late_rows(fresh, free, rows, len(batch) - len(fresh))
        if not late:
            return batch
        self.recorder.note_deferred(len(late))
        return [r for r in batch if r.rid not in late]

    def run_batch(self, batch: list[Req]) -> tuple[list[Req], StepOutput | None, Outbox]:
        """The engine's forward: (the rows it ran, their output, the failures). A row the engine can never run is
        failed; the others run. Engines validate a step before changing anything, so a refused step can be
        retried without the row."""
        out: Outbox = []
        while batch:
            try:
                return batch, self._forward(batch), out
            except EngineError as e:
                bad = [r for r in batch if r.rid == getattr(e, "rid", None)]
                if not bad:  # the engine did not say which row: find out one row at a time
                    rows, step, failed = self._run_rows_alone(batch)
                    return rows, step, out + failed
                out += self._fail(bad[0], str(e))
                batch = [r for r in batch if r is not bad[0]]
        return [], None, out

    def _run_rows_alone(self, batch: list[Req]) -> tuple[list[Req], StepOutput | None, Outbox]:
        out: Outbox = []
        rows, logits, hidden = [], [], []
        for r in batch:
            try:
                s = self._forward([r])
            except EngineError as e:
                out += self._fail(r, str(e))
                continue
            rows.append(r)
            logits.append(s.logits)
            hidden.append(s.hidden)
        if not rows:
            return [], None, out
        return rows, StepOutput(torch.cat(logits), torch.cat(hidden) if self.want_hidden else None), out

    def route_batch(self, batch: list[Req], step: StepOutput | None) -> tuple[list[Req], object, Outbox]:
        """The route kernel over the rows the engine ran (none: nothing to route)."""
        if not batch:
            return [], None, []
        return self._route(batch, step)

    def _route(self, batch: list[Req], step: StepOutput) -> tuple[list[Req], object, Outbox]:
        """The route kernel over the batch: (the rows routed, their result, the failures). A request whose own
        data the kernel refuses (a route state value out of its column's range, a sampler error) fails alone:
        after a failed batch each row is routed by itself, and the rows that fail by themselves are failed
        (an error to the client) while the others go on. The forward has run: a systemic fault surfaces there."""
        for r in batch:
            r.fed = len(r.tokens)
        try:
            result = self._route_rows(batch, step.logits, step.hidden)
        except Exception as e:
            if len(batch) == 1:
                return [], None, self._fail(batch[0], f"routing failed: {type(e).__name__}: {e}")
        else:
            note_logprobs(batch, range(len(batch)), step.logits, result.token)
            return batch, result, []
        return self._route_each(batch, step)

    def _route_each(self, batch: list[Req], step: StepOutput) -> tuple[list[Req], object, Outbox]:
        """`_route` after a failed batch: each row by itself, those that fail by themselves failed."""
        rows, results, out = [], [], []
        for i, r in enumerate(batch):
            hidden = step.hidden[i : i + 1] if step.hidden is not None else None
            try:
                results.append(self._route_rows([r], step.logits[i : i + 1], hidden))
            except Exception as e:
                out += self._fail(r, f"routing failed: {type(e).__name__}: {e}")
                continue
            rows.append(r)
        if not rows:
            return [], None, out
        token, logprob, rule = (
            torch.cat([getattr(x, f) for x in results]) for f in ("token", "logprob", "rule")
        )
        note_logprobs(rows, [batch.index(r) for r in rows], step.logits, token)
        return rows, RouteResult(token, logprob, rule), out

    def _route_rows(self, rows: list[Req], logits: torch.Tensor, hidden: torch.Tensor | None):
        with region("route"):
            state = self._route_state(rows, logits.device)
            # rows with a grammar: their tokens, drawn under its mask (runtime/grammar.py)
            forced = self.grammars.forced_tokens(
                rows, logits, state, getattr(self.kernel, "sampler", DEFAULT_SAMPLER)
            )
            extra = {} if forced is None else {"forced": forced}
            if not wanted(rows):
                return self.kernel(logits, hidden, state, **extra)
            result = self.kernel(logits, hidden, state, with_features=True, **extra)
        note_route_inputs(rows, result.features)  # asked for: the decision's inputs kept on the rows
        return result

    def _forward(self, rows: list[Req]) -> StepOutput:
        # before the route kernel moves `fed`
        self.recorder.note_first_runs(sum(1 for r in rows if not r.fed))
        # r.new_tokens(), inlined (once per row per step)
        with region("forward"):
            step = self.engine.forward(
                [StepInput(r.rid, r.tokens[r.fed :], score_k(r)) for r in rows], self.want_hidden
            )
        take_prompt_logprobs(rows, step)
        # what the engine ran (`StepOutput.stats`); from an engine that does not say, the tokens it was given
        ran, longest = step.stats.get("tokens"), step.stats.get("longest")
        if ran is None or longest is None:
            news = [len(r.tokens) - r.fed for r in rows]
            ran, longest = (sum(news) if ran is None else ran), (max(news) if longest is None else longest)
        self.recorder.note_ran(ran, longest)
        return step

    def _route_state(self, batch: list[Req], device: torch.device) -> RouteBatchState:
        """The kernel's per-row state, with one host-to-device copy into buffers the scheduler keeps
        (`RouteStatePacker`: valid for this step); the host-side sampling hints come along, so the kernel
        need not sync on the device to find them out."""
        packer = self._packer
        if packer is None or packer.device != device:
            packer = self._packer = RouteStatePacker(device)
        sampling = [r.sampling for r in batch]
        return packer.pack(
            seed=[s.seed for s in sampling],
            position=[len(r.tokens) for r in batch],  # the index of the token being sampled
            temperature=[float(s.temperature) for s in sampling],
            top_k=[s.top_k for s in sampling],
            top_p=[float(s.top_p) for s in sampling],
            run_length=[r.run_length for r in batch],  # committed before this token (the kernel adds 1)
            generated=[r.generated for r in batch],
        )

    def process_batch_result(self, batch: list[Req], result) -> Outbox:
        """Per row: the fired rule (ignored on a `for K` visit) decides stay / hop; a `drop` hop discards
        the token, anything else commits it; a committed token may finish the request (finish wins over a
        hop); the K-th token of a `for K` visit hands the request back."""
        out: Outbox = []
        emitted: list[m.TokenOut] = []
        finished: list[m.Finished] = []
        now = self.clock()
        prompts = prompt_outputs(batch)
        for req, tok, rule in zip(batch, *self._tokens_and_rules(result), strict=True):
            if req.sampling.max_tokens == 0:  # the prompt scored, nothing to write (echo)
                finished.append(m.Finished(req.rid, "length", self.model))
                self._drop(req)
                continue
            hop = self.rules[rule] if (req.for_left == 0 and rule >= 0) else None
            if hop is not None and hop.drop:
                emitted.append(m.TokenOut(req.rid, req.generated, [], self.model, hop_to=hop.target,
                                          route_inputs=token_inputs(req)))  # fmt: skip
                out.append(self._hop(req, hop))
                continue
            reason = self._commit(req, tok)
            hop = _visit_hop(req, hop, reason)
            emitted.append(
                self._token_out(req, tok, hop.target if hop is not None and reason is None else None)
            )
            self._settle(req, hop, reason, now, out, finished)
        if emitted or finished or prompts:
            out.insert(0, (FRONTEND, m.StepOutputs(self.model, emitted, finished, prompts)))
        return out

    @staticmethod
    def _tokens_and_rules(result) -> tuple[list[int], list[int]]:
        """The step's tokens and fired rules as host ints: on an accelerator one device-to-host copy (and one
        sync) of both, concatenated as int64, instead of one per tensor; on the CPU, no copy at all."""
        token, rule = result.token, result.rule
        if token.device.type == "cpu":
            return token.tolist(), rule.tolist()
        both = torch.cat((token, rule)).tolist()
        return both[: len(token)], both[len(token) :]

    def _commit(self, req: Req, tok: int) -> str | None:
        """Append the token; returns the finish reason, if it ends the request."""
        req.tokens.append(tok)
        req.seen_by[self.model] = len(req.tokens)
        req.run_length += 1
        return self._finish_reason(req, tok)

    def _finish_reason(self, req: Req, tok: int) -> str | None:
        s = req.sampling
        if tok in s.stop_token_ids or (not s.ignore_eos and tok in self.eos):
            return "stop"
        if s.grammar and self.grammars.accept(req, tok):
            return "stop"  # the grammar is complete
        if req.generated >= s.max_tokens or len(req.tokens) >= self.max_len:
            return "length"
        return None

    def _hop(self, req: Req, hop: Hop) -> tuple[str, m.PeerRequest]:
        """Make the request pending here and send the target the tokens it has not seen."""
        target = hop.target
        start = req.seen_by.get(target, 0)
        msg = m.PeerRequest(
            rid=req.rid,
            origin=self.model,
            start=start,
            tokens=req.tokens[start:],
            prompt_len=req.prompt_len,
            generated=req.generated,
            sampling=req.sampling,
            drop=hop.drop,
            for_k=hop.for_k,
            return_to=self.model if hop.for_k else None,
            n_active=self.batching.n_active,
            count_seq=self.batching.count_seq,
            seen=dict(req.seen_by),
        )
        req.seen_by[target] = len(req.tokens)
        msg.seen[target] = len(req.tokens)
        req.status = ReqStatus.PENDING
        self.runnable.pop(req.rid, None)
        return (target, msg)

    # ---- bookkeeping -------------------------------------------------------------------------------------

    def _admit(self, req: Req) -> None:
        self.reqs[req.rid] = req
        self.runnable[req.rid] = req
        self.runnable.move_to_end(req.rid)

    def _fail_new(self, rid: str, error: str) -> Outbox:
        self._tombstone(rid)
        return [(FRONTEND, m.StepOutputs(self.model, [], [m.Finished(rid, "error", self.model, error)]))]

    def _fail(self, req: Req, error: str) -> Outbox:
        logger.warning("%s: request %s failed: %s", self.model, req.rid, error)
        self._drop(req)
        return [(FRONTEND, m.StepOutputs(self.model, [], [m.Finished(req.rid, "error", self.model, error)]))]

    def _drop(self, req: Req) -> None:
        req.status = ReqStatus.FINISHED
        self.reqs.pop(req.rid, None)
        self.runnable.pop(req.rid, None)
        self.engine.release(req.rid)
        self._tombstone(req.rid)

    def _tombstone(self, rid: str) -> None:
        self.ended[rid] = None
        if len(self.ended) > TOMBSTONES:
            self.ended.popitem(last=False)

    # ---- introspection -----------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        c = {s: 0 for s in ReqStatus}
        for r in self.reqs.values():
            c[r.status] += 1
        return {s.value: n for s, n in c.items()}

    def stats(self) -> m.SubserverStats:
        c = self.counts()
        queue = m.QueueStats(waiting=c["waiting"], running=c["running"], pending=c["pending"])
        threshold = self.batching.config.thresholds[self.model]
        return self.recorder.stats(queue, self.engine.stats(), threshold)


def _without_resident(batch: list[Req], free: int, resident: Callable[[str], bool]) -> tuple[int, list[Req]]:
    """The free KV slots left once the rows whose KV is resident have their new tokens, and the other rows."""
    fresh = []
    for r in batch:
        if resident(r.rid):
            free -= len(r.tokens) - r.fed
        else:
            fresh.append(r)
    return free, fresh


def _late_rows(fresh: list[Req], free: int, rows: int, admitted: int) -> set[str]:
    """The ids of the requests without KV resident that wait for a later step: in order, each one is admitted
    while `free` slots and `rows` hold its whole history (the first always, if no row is `admitted` yet)."""
    late = set()
    for r in fresh:
        need = len(r.tokens)
        if admitted and (need > free or rows < 1):
            late.add(r.rid)
            continue
        free -= need
        rows -= 1
        admitted += 1
    return late


def _visit_hop(req: Req, hop: Hop | None, reason: str | None) -> Hop | None:
    """The row's hop once its token is committed: on a `for K` visit, the K-th token hands the request back."""
    if reason is None and req.for_left > 0:
        req.for_left -= 1
        if req.for_left == 0:
            return Hop(req.return_to)
    return hop
