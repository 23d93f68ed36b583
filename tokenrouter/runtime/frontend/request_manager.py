"""The frontend's side of the ZeroMQ contract: submit requests, route subserver outputs to their requests.

One `RequestManager` per frontend process, on the asyncio loop that serves HTTP. It owns the frontend's PULL
socket (StepOutputs, SubserverStats, and — from the launcher — Ready and Fatal) and one PUSH socket per
subserver. It knows the number of active requests n exactly and publishes every change: in `NewRequest`
to the entry subserver, and as one coalesced `ActiveCount` per loop turn to the others.

Every subserver's periodic `SubserverStats` (and its step outputs) are a heartbeat: a ready subserver silent
for `heartbeat_timeout_s` (remote ones, on other hosts: dead or unreachable) or `liveness_timeout_s` (local
ones: a process that is alive but frozen or stuck, which the launcher cannot see) is treated as failed exactly
like a `Fatal` naming it. Every `Fatal`, received or so found, fails the requests in flight (503), turns
/health to 503 and is passed on to the launcher, which shuts the deployment down as for a dead process. The
watch pauses while a live profile starts or stops (a subserver writes its trace in one go).

Tokens of one request may arrive out of order when it hops (two subservers, two sockets), so each request
keeps a reorder buffer keyed by the token's index among the generated tokens; a request is complete when
its `Finished` has arrived and no index below the highest one is missing.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field

import msgspec
import zmq
import zmq.asyncio

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.frontend.metrics import Metrics
from tokenrouter.runtime.frontend.protocol import APIError
from tokenrouter.runtime.frontend.route_inputs import token_decisions
from tokenrouter.runtime.ipc import bind, secure_context

log = logging.getLogger("tokenrouter.frontend")

_encoder = msgspec.msgpack.Encoder()


def starting_error() -> APIError:
    """A request that comes before every subserver is ready."""
    return APIError(503, "the server is still starting; retry when GET /health returns 200", code="starting")


@dataclass(slots=True)
class ReqState:
    """What the frontend knows about one request; the HTTP handler consumes `ready` as it fills."""

    rid: str
    prompt_len: int
    event: asyncio.Event = field(default_factory=asyncio.Event)
    ready: list[tuple[int, str]] = field(
        default_factory=list
    )  # contiguous (token id, model), not yet consumed
    next_index: int = 0
    buffer: dict[int, tuple[int, str]] = field(default_factory=dict)  # tokens past a gap
    hops: list[tuple[str, str]] = field(default_factory=list)
    finish_reason: str | None = None
    error: APIError | None = None
    t_arrival: float = field(default_factory=time.monotonic)
    got_first: bool = False
    models: set[str] = field(default_factory=set)  # the models that wrote a token of it
    logprobs: dict[int, list] = field(default_factory=dict)  # token index -> TokenOut.logprobs entry
    prompt_logprobs: list | None = None  # sampling.prompt_logprobs ≥ 0: PromptLogprobs.logprobs, once scored
    decisions: dict[int, list] = field(
        default_factory=dict
    )  # token index -> its route decisions (route_inputs.py)

    @property
    def done(self) -> bool:
        return self.error is not None or (self.finish_reason is not None and not self.buffer)

    def add(self, out: m.TokenOut) -> None:
        for idx, d in token_decisions(out):  # asked for (route_inputs.py); a duplicate token's are dropped
            if d.get("dropped") or idx >= self.next_index:
                at = self.decisions.setdefault(idx, [])
                # a drop hop's decision comes first at its position, whichever reached the frontend first
                at.insert(sum(1 for x in at if x.get("dropped")) if d.get("dropped") else len(at), d)
        for i, tok in enumerate(out.token_ids):
            idx = out.index + i
            if idx >= self.next_index:
                self.buffer[idx] = (tok, out.model)
                if out.logprobs is not None:
                    self.logprobs[idx] = out.logprobs[i]
        while self.next_index in self.buffer:
            self.ready.append(self.buffer.pop(self.next_index))
            self.next_index += 1
        if out.hop_to is not None:
            self.hops.append((out.model, out.hop_to))

    def take(self) -> list[tuple[int, str]]:
        out, self.ready = self.ready, []
        return out


class RequestManager:
    def __init__(
        self,
        endpoints: dict,
        models: list[str],
        entry: str,
        remote: list[str] = (),
        heartbeat_timeout_s: float = 10.0,
        liveness_timeout_s: float = 60.0,
    ) -> None:
        self.models = list(models)
        self.entry = entry
        self.endpoints = endpoints
        self.remote = [x for x in models if x in remote]
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.liveness_timeout_s = liveness_timeout_s
        # subserver address → monotonic time of the last message from it (one lockstep process holds several
        # models at one address)
        self.last_heard: dict[str, float] = {}
        self.metrics = Metrics(models=self.models)
        self.requests: dict[str, ReqState] = {}
        self.ready_models: dict[str, dict] = {}
        self.fatal: tuple[str, str] | None = None  # (process name, error)
        self.closing: APIError | None = None  # set by shutdown()
        self._init_sockets(endpoints)
        self._decoder = msgspec.msgpack.Decoder(m.ToFrontend)
        self._count_dirty = False
        # numbers the changes of n_active (`_count_changed`), from the wall clock in µs: a frontend started
        # again numbers above its predecessor, whose numbers a remote subserver may still hold
        self._count_seq = time.time_ns() // 1000
        self._task: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None
        self._notify: asyncio.Task | None = None  # a Fatal on its way to the launcher
        self.profiling = False  # a live profile runs (POST /start_profile until /stop_profile)
        self._profile_replies: dict[str, asyncio.Future] = {}  # model -> its ProfileDone, awaited

    def _init_sockets(self, endpoints: dict) -> None:
        """The frontend's PULL socket (bound) and a PUSH socket to each model's subserver."""
        self._ctx = zmq.asyncio.Context()
        self._auth = secure_context(self._ctx, endpoints.get("key"))
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        bind(self._pull, endpoints["frontend"])
        self._push: dict[str, zmq.asyncio.Socket] = {}
        for name in self.models:
            s = self._ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(endpoints["subservers"][name])
            self._push[name] = s

    # ---- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._recv_loop())
        self._watch = loop.create_task(self._watch_heartbeats())

    async def close(self) -> None:
        for task in (self._task, self._watch):
            if task is not None:
                task.cancel()
        if self._auth is not None:
            self._auth.stop()
        self._ctx.destroy(linger=0)

    @property
    def is_ready(self) -> bool:
        return self.fatal is None and all(x in self.ready_models for x in self.models)

    @property
    def n_active(self) -> int:
        return len(self.requests)

    # ---- requests -----------------------------------------------------------------------------------------
    def ensure_serving(self) -> None:
        """Raise what a request meets where the deployment does not serve: its shutdown, its failure, or (while
        it starts) a 503."""
        if self.closing is not None:
            raise self.closing
        if self.fatal is not None:
            raise self.fatal_error()
        if not self.is_ready:
            raise starting_error()

    def submit(self, prompt_ids: list[int], sampling: m.SamplingSpec) -> ReqState:
        self.ensure_serving()
        rid = secrets.token_hex(12)
        # Registered only once sent: a request that cannot be encoded or sent leaves nothing behind.
        new = m.NewRequest(
            rid=rid,
            prompt_ids=prompt_ids,
            sampling=sampling,
            n_active=self.n_active + 1,
            count_seq=self._count_seq + 1,
        )
        self._send_new(new)
        st = ReqState(rid=rid, prompt_len=len(prompt_ids))
        self.requests[rid] = st
        self.metrics.requests_total += 1
        self.metrics.prompt_tokens += len(prompt_ids)
        self._count_changed()
        return st

    def _send_new(self, new: m.NewRequest) -> None:
        """Send a new request to the entry model's subserver; an APIError if it cannot be encoded or sent."""
        try:
            data = _encoder.encode(new)
        except (OverflowError, msgspec.EncodeError) as e:
            raise APIError(400, f"a value in the request is out of range: {e}") from None
        if not self._send_bytes(self.entry, data, "NewRequest"):
            self.metrics.requests_total += 1
            self.metrics.requests_finished["error"] += 1
            raise APIError(
                503, f"subserver {self.entry!r} is not taking requests (its queue is full)", code="overloaded"
            )

    def abort(self, rid: str, reason: str = "abort") -> None:
        """The client went away or a stop string matched: free the request everywhere."""
        st = self.requests.pop(rid, None)
        if st is None:
            return
        self.metrics.requests_finished["stop" if reason == "stop" else "abort"] += 1
        self._broadcast(m.Abort(rid=rid, reason=reason))
        self._count_changed()

    def _finish(self, st: ReqState, reason: str) -> None:
        self.requests.pop(st.rid, None)
        self.metrics.requests_finished[reason] += 1
        self.metrics.e2e.observe(time.monotonic() - st.t_arrival)
        for x in st.models:
            self.metrics.visits[x] += 1
        self._broadcast(m.Release(rid=st.rid))
        self._count_changed()

    # ---- sending ------------------------------------------------------------------------------------------
    def _send(self, name: str, msg: msgspec.Struct) -> bool:
        return self._send_bytes(name, _encoder.encode(msg), type(msg).__name__)

    def _send_bytes(self, name: str, data: bytes, what: str) -> bool:
        try:  # never block the event loop on a dead or slow subserver
            self._push[name].send(data, zmq.NOBLOCK)
            return True
        except zmq.Again:
            log.error("dropped %s to subserver %r: its queue is full", what, name)
            return False

    def _broadcast(self, msg: msgspec.Struct) -> None:
        for name in self.models:
            self._send(name, msg)

    def _count_changed(self) -> None:
        # Number every change of n (a subserver keeps the count with the highest number, so a hop carrying
        # its sender's older count cannot undo a newer one); coalesce the ActiveCounts: one per loop turn,
        # whatever the number of arrivals and departures in it.
        self._count_seq += 1
        if not self._count_dirty:
            self._count_dirty = True
            asyncio.get_running_loop().call_soon(self._publish_count)

    def _publish_count(self) -> None:
        self._count_dirty = False
        self._broadcast(m.ActiveCount(n_active=self.n_active, count_seq=self._count_seq))

    # ---- receiving ----------------------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        while True:
            data = await self._pull.recv()
            try:
                msg = self._decoder.decode(data)
            except msgspec.DecodeError as e:
                log.error("undecodable message on the frontend socket: %s", e)
                continue
            try:
                self._dispatch[type(msg)](self, msg)
            except Exception:
                log.exception("failed to handle %s", type(msg).__name__)

    def _on_step(self, msg: m.StepOutputs) -> None:
        self._heard(msg.model)
        touched = self._on_tokens(msg)
        for p in msg.prompts:
            if (st := self.requests.get(p.rid)) is not None:
                st.prompt_logprobs = p.logprobs
        for fin in msg.finished:
            st = self.requests.get(fin.rid)
            if st is None:
                continue
            if fin.reason == "error":
                st.error = APIError(
                    500, f"model {fin.model!r} failed the request: {fin.error or 'unknown error'}"
                )
            st.finish_reason = fin.reason
            touched.add(fin.rid)
        for rid in touched:
            st = self.requests[rid]
            if st.done:
                self._finish(st, "error" if st.error else st.finish_reason or "stop")
            st.event.set()

    def _on_tokens(self, msg: m.StepOutputs) -> set[str]:
        """Count a step's tokens and hand them to their requests; the ids of the requests that got some."""
        touched: set[str] = set()
        for out in msg.tokens:
            st = self.requests.get(out.rid)
            self.metrics.tokens[out.model] += len(out.token_ids)
            if out.hop_to is not None:
                self.metrics.hops[(out.model, out.hop_to)] += 1
            if st is not None:
                if out.token_ids and not st.got_first:
                    st.got_first = True
                    self.metrics.ttft.observe(time.monotonic() - st.t_arrival)
                st.add(out)
                if out.token_ids:
                    st.models.add(out.model)
                touched.add(out.rid)
        return touched

    def _on_stats(self, msg: m.SubserverStats) -> None:
        self._heard(msg.model)
        self.metrics.on_stats(msg)

    def _on_ready(self, msg: m.Ready) -> None:
        self._heard(msg.name)
        self.ready_models[msg.name] = dict(msg.info)

    def _heard(self, model: str) -> None:
        self.last_heard[self.endpoints["subservers"].get(model, model)] = time.monotonic()

    async def _watch_heartbeats(self) -> None:
        """A ready subserver silent past its limit has failed (see the module doc)."""
        limits = {
            x: self.heartbeat_timeout_s if x in self.remote else self.liveness_timeout_s for x in self.models
        }
        while self.fatal is None:
            await asyncio.sleep(min(0.25, min(limits.values()) / 4))
            now = time.monotonic()
            for name in self.models:
                addr = self.endpoints["subservers"][name]
                if self._profile_replies:  # a start or stop of a profile: its trace is written in one go
                    self.last_heard[addr] = now
                    continue
                if name not in self.ready_models or now - self.last_heard.get(addr, now) <= limits[name]:
                    continue
                why = "dead or unreachable" if name in self.remote else "frozen or stuck in a step"
                where = f"remote subserver at {addr}" if name in self.remote else f"subserver {name!r}"
                error = f"{where} sent no heartbeat for {limits[name]:g} s ({why})"
                self._on_fatal(m.Fatal(name=name, error=error))
                return

    def _on_fatal(self, msg: m.Fatal) -> None:
        if self.fatal is not None:
            return
        self.fatal = (msg.name, msg.error)
        # the launcher reports the failure itself (at startup as `error: … failed to start: …`); here it is news
        # only where requests in flight fail with it
        (log.error if self.requests else log.info)(
            "%r failed; failing %d in-flight request(s)", msg.name, len(self.requests)
        )
        self._fail_all(self.fatal_error())
        if "launcher" in self.endpoints:  # (a manager under test may have none)
            self._notify = asyncio.get_running_loop().create_task(self._pass_on(msg))

    async def _pass_on(self, msg: m.Fatal) -> None:
        """Hand a Fatal to the launcher, which shuts the deployment down (it ignores one it already knows)."""
        launcher = self._ctx.socket(zmq.PUSH)
        launcher.setsockopt(zmq.LINGER, 1000)
        launcher.connect(self.endpoints["launcher"])
        await launcher.send(_encoder.encode(m.Fatal(name=msg.name, error=msg.error)))
        launcher.close()

    # ---- live profiles --------------------------------------------------------------------------------------
    async def profile(self, start: bool, out_dir: str, timeout_s: float) -> dict[str, list[str]]:
        """Start (or stop) `torch.profiler` in every subserver and wait for each one's answer: model -> the files
        it wrote (none at a start). A 409 if the profile already runs (is not running), a 500 naming the
        subserver whose profiler failed, a 504 if one does not answer in `timeout_s`."""
        if start == self.profiling:
            raise APIError(409, "a profile is already running; POST /stop_profile first" if start else
                           "no profile is running; POST /start_profile first", code="profile_state")  # fmt: skip
        if self._profile_replies:
            raise APIError(
                409, "a profile is being started or stopped; retry when it answers", code="profile_state"
            )
        replies = await self._ask_profile(start, out_dir, timeout_s)
        self.profiling = start
        failed = {x: r.error for x, r in replies.items() if r.error}
        if failed:
            if start:  # the others' profiles are discarded, so that a start can be tried again
                self.profiling = False
                for x in replies.keys() - failed.keys():
                    self._send(x, m.Profile(model=x, start=False))
            why = "; ".join(f"{x!r}: {e}" for x, e in failed.items())
            raise APIError(500, f"the profiler failed in {why}", type="server_error", code="profile_failed")
        return {x: list(r.files) for x, r in replies.items()}

    async def _ask_profile(self, start: bool, out_dir: str, timeout_s: float) -> dict[str, m.ProfileDone]:
        """Send every subserver the Profile message and wait for each one's ProfileDone (a 504 if one is late)."""
        loop = asyncio.get_running_loop()
        self._profile_replies = {x: loop.create_future() for x in self.models}
        try:
            for x in self.models:
                self._send(x, m.Profile(model=x, start=start, out_dir=out_dir))
            _, pending = await asyncio.wait(self._profile_replies.values(), timeout=timeout_s)
            if pending:
                late = [x for x, f in self._profile_replies.items() if f in pending]
                self.profiling = start  # those that answered did act; a retry of the other action is allowed
                raise APIError(504, f"subserver(s) {', '.join(map(repr, late))} did not answer within "
                               f"{timeout_s:g} s", code="profile_timeout")  # fmt: skip
            replies = {x: f.result() for x, f in self._profile_replies.items()}
        finally:
            self._profile_replies = {}
        return replies

    def _on_profile_done(self, msg: m.ProfileDone) -> None:
        f = self._profile_replies.get(msg.model)
        if f is not None and not f.done():
            f.set_result(msg)

    def shutdown(self) -> None:
        """The server is stopping: fail what is in flight (503) and refuse new requests."""
        self.closing = APIError(503, "the server is shutting down", code="shutting_down")
        self._fail_all(self.closing)

    def _fail_all(self, err: APIError) -> None:
        for st in self.requests.values():
            st.error = err
            st.event.set()
            self.metrics.requests_finished["error"] += 1
        self.requests.clear()

    def fatal_error(self) -> APIError:
        name, error = self.fatal or ("?", "")
        last = error.strip().splitlines()[-1] if error.strip() else "unknown error"
        return APIError(
            503,
            f"{'the frontend' if name == 'frontend' else f'subserver {name!r}'} failed: {last}; the server is shutting down",
            type="server_error",
            code="subserver_failed",
        )

    _dispatch = {
        m.StepOutputs: _on_step,
        m.SubserverStats: _on_stats,
        m.Ready: _on_ready,
        m.Fatal: _on_fatal,
        m.ProfileDone: _on_profile_done,
    }
