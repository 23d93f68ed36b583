"""A discrete-event simulation of the same closed system as the chain, in continuous time.

Same inputs as `dtmc.py` (step latencies L_i(b), geometric routing p_ij, committed tokens c_ij, N requests,
thresholds B) and the same scheduling rule: an idle model whose queue holds at least B_i starts a step with
every queued request; completions at the same instant are processed together. It is independent code (no
discretization, sampled routing), so it checks the chain; and it covers what the chain does not:

- `request_tokens` + `think_ms`: a request leaves after committing that many tokens and a new one arrives
  at the entry model after a think time with mean `think_ms` (exponential, or hyperexponential with
  squared coefficient of variation `burstiness` > 1 for bursty arrivals). While fewer than N requests are
  active the thresholds are lowered by the runtime's rule (`effective_thresholds`, restated here because
  the simulator does not import the runtime), and `max_delay_ms` starts a waiting queue anyway.
- `held_rule` (the runtime's rule): a model also steps when every request it holds
  (it ran them, and they have not ended) is queued there, as no other row can join. With alike requests that
  never end, as the chain has them, it changes nothing after the first visits; with requests that end, or
  that route unlike each other, a model that few requests visit stops waiting for rows that would not come.
- `requests`: a finite run, as a closed-loop benchmark makes one: these requests in order, N at a time,
  each routed by its own matrix (requests that are not alike: a router that fires on some prompts only)
  and, with `request_lengths`, of its own length; the run ends when the last one has committed its tokens
  (`request_tokens` each, or its own), and the throughput is the tokens over
  that makespan, tail included (no warm-up; `horizon_ms` only caps the simulated time).
- `hop_ms`: a hop from model i reaches model j `hop_ms[j]` ms after i's step ends (the chain takes hops as
  instant; the subservers measure this delay, `tokenrouter_hop_delay_seconds_total`).
- `gap_ms`: each step of model i takes `gap_ms[i]` ms of host time beyond its step latency (the subservers
  measure the gap between back-to-back steps, `tokenrouter_step_gap_seconds_total`).
- `arrival_rate_per_s`: an open loop, as `tokenrouter bench --request-rate` makes one. Requests arrive as a
  Poisson process at that rate; N is the most in flight at once, and a request that arrives with N in flight
  waits for one to end. Each request commits `request_tokens` and leaves. The result has each measured
  request's latencies (`SimResult.latency`: the wait at the cap, TTFT as the end of its first step, TPOT, E2E
  and the time from arrival to the end), for the requests that arrived after the warm-up and ended within the
  horizon, and the backlog at the end (growing: the rate is over what the system serves).
- prompt prefills (`SystemInputs.prefill`, `PrefillCost.ms_per_visit`): a step of model i takes that much longer
  for each of its rows that runs at i for the first time in its request's life, where the chain spreads the
  cost over every step. Requests that never end (no `request_tokens`) prefill once, in the warm-up.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from tokenrouter.throughput.inputs import SystemInputs
from tokenrouter.throughput.sim_config import SimConfig, SimResult

_EPS = 1e-9  # ms: events closer than this are simultaneous
# a step's rows this many or more are routed with numpy at once (fewer: one by one, which is faster for them)
_ROWS_AT_ONCE = 32


def effective_thresholds(thresholds: tuple[int, ...], n_active: int) -> tuple[int, ...]:
    """The runtime's rule: while Σ(B_i − 1) ≥ max(n, 1), lower the first largest B_i by one."""
    eff = list(thresholds)
    excess = sum(b - 1 for b in eff) - (max(n_active, 1) - 1)
    while excess > 0:
        j = eff.index(max(eff))
        eff[j] -= 1
        excess -= 1
    return tuple(eff)


def _think_sampler(cfg: SimConfig, rng: np.random.Generator):
    mean, c2 = cfg.think_ms, cfg.burstiness
    if mean <= 0:
        return lambda: 0.0
    if c2 <= 1.0 + 1e-12:
        return lambda: float(rng.exponential(mean))
    p1 = 0.5 * (1.0 + math.sqrt((c2 - 1.0) / (c2 + 1.0)))  # balanced-means H2
    m1, m2 = mean / (2 * p1), mean / (2 * (1 - p1))
    return lambda: float(rng.exponential(m1 if rng.random() < p1 else m2))


def simulate(inputs: SystemInputs, cfg: SimConfig) -> SimResult:
    m = inputs.n_models
    if len(cfg.thresholds) != m:
        raise ValueError(f"expected {m} thresholds, got {len(cfg.thresholds)}")
    if cfg.hop_ms is not None and len(cfg.hop_ms) != m:
        raise ValueError(f"expected {m} hop delays, got {len(cfg.hop_ms)}")
    if cfg.gap_ms is not None and len(cfg.gap_ms) != m:
        raise ValueError(f"expected {m} step gaps, got {len(cfg.gap_ms)}")
    sim = _Sim(inputs, cfg)
    sim.run()
    return sim.result()


class _Sim:
    """One run's state and its event loop: at each event, the steps that end route their rows (`_complete`),
    the hops, think times and arrivals due are queued, and the idle models whose queues may go start a step
    (`_start_ready`). Request slots 0..N-1 each hold one request at a time."""

    # the event loop reads these at every event: slots, for the speed of their reads
    __slots__ = (
        "inputs", "cfg", "m", "n", "entry", "hop_ms", "host_ms", "c_rows", "ending", "rng", "think",
        "cums", "req_of", "warmup", "next_req", "slots", "tokens_of", "limit_of", "returns", "n_requests",
        "opened", "given", "next_arrival", "arrival_gap_ms", "free", "backlog", "arrived_at", "started_at",
        "first_at", "done", "active",
        "queue", "since", "running", "end", "transit", "visit_ms", "prefilled", "busy", "batch_time",
        "queue_time", "steps", "by_batch",
        "held", "left", "first", "leaves", "away", "expect", "whatif",
        "now", "t_end", "tokens", "finished", "stalled", "drained", "eff", "eff_at",
    )  # fmt: skip

    def __init__(self, inputs: SystemInputs, cfg: SimConfig) -> None:
        m = self.m = inputs.n_models
        self.inputs, self.cfg, self.n, self.entry = inputs, cfg, inputs.concurrency, inputs.entry
        self.hop_ms = cfg.hop_ms or (0.0,) * m
        self.host_ms = cfg.gap_ms or (0.0,) * m  # each step's host time beyond its latency
        self.c_rows = inputs.c.tolist()  # c_ij as floats: the per-row loop reads them
        # requests end (an open loop's too: it needs request_tokens)
        self.ending = cfg.request_tokens is not None
        self.rng = np.random.default_rng(cfg.seed)
        self.think = _think_sampler(cfg, self.rng)
        self._init_requests()
        self._init_open_loop()
        self._init_models()
        self._init_what_ifs()
        self.now, self.t_end = 0.0, self.warmup + cfg.horizon_ms
        self.tokens, self.finished = 0.0, 0
        self.stalled = self.drained = False
        self.eff = tuple(cfg.thresholds)
        self.eff_at: dict[
            int, tuple[int, ...]
        ] = {}  # the thresholds in effect at each count of active requests

    def _init_requests(self) -> None:
        """Which request each slot holds (without `requests` every request routes by p), each slot's tokens
        committed and the count at which its request ends."""
        cfg, m, n = self.cfg, self.m, self.n
        if cfg.requests is None:
            self.cums, self.req_of, self.warmup = [np.cumsum(self.inputs.p, axis=1)], [0] * n, cfg.warmup_ms
        else:
            for k, p in enumerate(cfg.requests):
                if p.shape != (m, m) or np.any(p < 0) or not np.allclose(p.sum(axis=1), 1.0, atol=1e-6):
                    raise ValueError(f"request {k}: routing must be {m}x{m}, non-negative, rows summing to 1")
            self.cums, self.warmup = [np.cumsum(p, axis=1) for p in cfg.requests], 0.0
            self.req_of = list(range(min(n, len(cfg.requests))))
        # a finite run's next request to start, and its count
        self.next_req = len(self.req_of) if cfg.requests is not None else 0
        self.n_requests = len(cfg.requests) if cfg.requests is not None else -1
        slots = self.slots = len(self.req_of)
        self.tokens_of = np.zeros(slots)
        self.limit_of = np.array(
            [cfg.request_lengths[self.req_of[r]] for r in range(slots)]
            if cfg.request_lengths
            else [cfg.request_tokens or math.inf] * slots,
            dtype=float,
        )
        self.returns: list[tuple[float, int]] = []  # a heap of (time, request slot) of requests thinking

    def _init_open_loop(self) -> None:
        """An open loop: slots start free, requests arrive (Poisson at the rate, or at the times given). Its free
        slots (popped from the end), the arrival times of the requests waiting at the cap (oldest first), each
        slot's request's arrival, start and first token, and the measured requests' (arrival, start, first token,
        end)."""
        cfg, slots = self.cfg, self.slots
        self.opened = opened = cfg.arrival_rate_per_s is not None or cfg.arrivals_ms is not None
        if cfg.arrivals_ms is not None:
            self.given = iter((*cfg.arrivals_ms, math.inf))
            self.next_arrival = next(self.given)
        else:
            self.arrival_gap_ms = 1000.0 / cfg.arrival_rate_per_s if opened else math.inf
            self.next_arrival = 0.0 if opened else math.inf
        self.free = list(range(slots - 1, -1, -1)) if opened else []
        self.backlog: deque[float] = deque()
        self.arrived_at, self.started_at, self.first_at = [0.0] * slots, [0.0] * slots, [math.inf] * slots
        self.done: list[tuple[float, float, float, float]] = []
        self.active = 0 if opened else slots

    def _following(self) -> float:
        """The open loop's next arrival time after the current one."""
        if self.cfg.arrivals_ms is not None:
            return next(self.given)
        return self.next_arrival + float(self.rng.exponential(self.arrival_gap_ms))

    def _init_models(self) -> None:
        """Per model: the request slots queued there (in the order they came) and since when the first has
        waited, those running and when their step ends, what the measured time adds up; the hops on their way."""
        m, inputs = self.m, self.inputs
        self.queue: list[list[int]] = [[] for _ in range(m)]
        self.queue[inputs.entry] = [] if self.opened else list(range(self.slots))
        self.since = [0.0] * m
        self.running: list[list[int]] = [[] for _ in range(m)]
        self.end = [math.inf] * m
        # a heap of the hops on their way, a step's to one model together: (arrival time, the first request slot,
        # model, the request slots in order)
        self.transit: list[tuple[float, int, int, list[int]]] = []
        # the ms a request's first step there adds (its prompt prefill), and the slots that have had it
        self.visit_ms = [
            (c.ms_per_visit or 0.0) if (c := inputs.prefill_at(i)) is not None else 0.0 for i in range(m)
        ]
        self.prefilled: list[set[int]] = [set() for _ in range(m)]
        self.busy, self.batch_time, self.queue_time, self.steps = (np.zeros(m) for _ in range(4))
        self.by_batch: list[dict[int, int]] = [{} for _ in range(m)]  # the measured steps by their rows

    def _init_what_ifs(self) -> None:
        """Per model, the request slots it ran that have not ended (`held_rule`), and the what-ifs' bookkeeping:
        when each request it held last left it, first stepped there, and how often it left."""
        m, cfg = self.m, self.cfg
        self.held: list[set[int]] = [set() for _ in range(m)]
        self.left: list[dict[int, float]] = [{} for _ in range(m)]
        self.first: list[dict[int, float]] = [{} for _ in range(m)]
        self.leaves: list[dict[int, int]] = [{} for _ in range(m)]
        self.away, self.expect = cfg.held_away_ms, cfg.held_expect
        self.whatif = self.away is not None or self.expect is not None  # they keep a row's bookkeeping each

    def run(self) -> None:
        """The event loop, to the horizon (or a stall, the finite run's end, the given arrivals' end)."""
        end, transit, returns, eff_at = self.end, self.transit, self.returns, self.eff_at
        t_end, m, finite = self.t_end, self.m, self.cfg.requests is not None
        self._start_ready(self.now)
        while self.now < t_end:
            nxt = self._next_event()
            if nxt is None:
                self.stalled = True
                break
            nxt = min(nxt, t_end)
            self._account(nxt)
            self.now = now = nxt
            if now >= t_end:
                break
            measuring = now > self.warmup or finite
            for i in range(m):
                if end[i] <= now + _EPS:
                    self._complete(i, measuring)
            if transit and transit[0][0] <= now + _EPS:
                self._deliver_hops()
            if (returns and returns[0][0] <= now + _EPS) or self.next_arrival <= now + _EPS:
                self._take_returns_and_arrivals()
            if self._over():
                break
            self.eff = eff_at.get(self.active) or self._thresholds_at(self.active)
            self._start_ready(now)

    def _over(self) -> bool:
        """Whether the run ends here: a finite run's last request has ended (its makespan), or an open loop's
        given arrivals are over and every one of their requests has ended (`drained`)."""
        if self.finished == self.n_requests:
            return True
        if self.next_arrival == math.inf and self.opened and self.active == 0 and not self.backlog:
            self.drained = True
            return True
        return False

    def _thresholds_at(self, active: int) -> tuple[int, ...]:
        """The thresholds in effect at this count of active requests (`effective_thresholds`), kept."""
        full = tuple(self.cfg.thresholds)
        eff = self.eff_at[active] = effective_thresholds(full, active) if active < self.n else full
        return eff

    def _next_event(self) -> float | None:
        """The time of the next event: a step's end, a return, a hop's or a request's arrival, a timeout, a
        what-if's moment to look again; None where nothing can happen (a stall)."""
        cfg, m, now, running, queue = self.cfg, self.m, self.now, self.running, self.queue
        candidates = [e for e in self.end if e < math.inf]
        if self.returns:
            candidates.append(self.returns[0][0])
        if self.transit:
            candidates.append(self.transit[0][0])
        if self.opened:
            candidates.append(self.next_arrival)
        if cfg.max_delay_ms is not None:
            for i in range(m):
                if not running[i] and queue[i]:
                    candidates.append(self.since[i] + cfg.max_delay_ms)
        away = self.away
        if away is not None:  # a waiting model stops waiting for a request once it has been away that long
            for i in range(m):
                if not running[i] and queue[i]:
                    left = self.left[i]
                    gone = [left[r] + away for r in self.held[i] if r in left and left[r] + away > now + _EPS]
                    if gone:
                        candidates.append(min(gone))
        # what the requests away are expected to bring shrinks as time passes: a waiting model looks again
        if self.expect is not None and any(not running[i] and queue[i] for i in range(m)):
            candidates.append(now + 0.5)
        return min(candidates) if candidates else None

    def _account(self, nxt: float) -> None:
        """The measured time from now to `nxt`: each model's busy time, rows in steps and rows queued."""
        lo, hi = max(self.now, self.warmup), nxt
        if hi > lo:
            running, queue = self.running, self.queue
            busy, batch_time, queue_time = self.busy, self.batch_time, self.queue_time
            for i in range(self.m):
                if running[i]:
                    busy[i] += hi - lo
                    batch_time[i] += (hi - lo) * len(running[i])
                queue_time[i] += (hi - lo) * len(queue[i])

    def _start_ready(self, t: float) -> None:
        """Start a step at each idle model whose queue reaches its threshold, has waited out the timeout, or
        (the held rule) holds every request the model waits for."""
        queue, running, since, eff = self.queue, self.running, self.since, self.eff
        max_delay = self.cfg.max_delay_ms
        new = []
        for i in range(self.m):
            if running[i] or not queue[i]:
                continue
            waited = t - since[i]
            if (
                len(queue[i]) >= eff[i]
                or (max_delay is not None and waited >= max_delay - _EPS)
                or (self.cfg.held_rule and self._nobody_else(i, t, waited))
            ):
                running[i], queue[i] = queue[i], []
                new.append(i)
        if new:
            self._start(new, t)

    def _start(self, new: list[int], t: float) -> None:
        """Models `new` start the step of their running rows at t: when it ends, its host time and the prompt
        prefills of the rows new to the model included."""
        running, end, host_ms, visit_ms = self.running, self.end, self.host_ms, self.visit_ms
        busy_now = [bool(x) for x in running]  # the steps starting now run beside each other
        for i in new:
            end[i] = t + self.inputs.step_at(i, len(running[i]), busy_now)
            if host_ms[i]:
                end[i] += host_ms[i]
            if visit_ms[i]:
                fresh = [r for r in running[i] if r not in self.prefilled[i]]
                end[i] += visit_ms[i] * len(fresh)
                self.prefilled[i].update(fresh)

    def _nobody_else(self, i: int, t: float, waited: float) -> bool:
        """The held rule: model i waits for no request (every request it holds is queued; with `held_away_ms`,
        every one not away that long; with `held_expect`, fewer rows than that expected back in time)."""
        queued = set(self.queue[i])
        if (expect := self.expect) is not None:
            window = self.cfg.max_delay_ms - waited
            first, leaves = self.first[i], self.leaves[i]
            due = 0.0
            for r in self.held[i] - queued:
                since = t - first.get(r, t)
                due += 1.0 if since <= _EPS else 1.0 - math.exp(-leaves.get(r, 0) / since * window)
            return due < expect
        if (away := self.away) is None:
            return self.held[i] <= queued
        return {r for r in self.held[i] if t - self.left[i].get(r, t) < away - _EPS} <= queued

    def _enqueue(self, j: int, rs: list[int]) -> None:
        """Queue request slots rs at model j, in order (the first in an empty queue waits from now)."""
        queue = self.queue[j]
        if not queue:
            self.since[j] = self.now
        queue.extend(rs)

    def _complete(self, i: int, measuring: bool) -> None:
        """Model i's step ends: its rows commit their tokens and go where the routing sends them."""
        running, end = self.running, self.end
        batch, running[i], end[i] = running[i], [], math.inf
        self.held[i].update(batch)
        if self.expect is not None:
            for r in batch:
                self.first[i].setdefault(r, self.now)
        if measuring:
            self.steps[i] += 1
            self.by_batch[i][len(batch)] = self.by_batch[i].get(len(batch), 0) + 1
        us = self.rng.random(len(batch))
        cums = self.cums
        if len(cums) == 1:  # every request routes alike: one search for the whole batch
            dests = cums[0][i].searchsorted(us * cums[0][i][-1], side="right")
        else:
            req_of = self.req_of
            dests = [cums[req_of[r]][i].searchsorted(u * cums[req_of[r]][i][-1], side="right")
                     for r, u in zip(batch, us, strict=True)]  # fmt: skip
        js = np.minimum(dests, self.m - 1)
        if len(batch) >= _ROWS_AT_ONCE and not self.whatif:
            self._route_at_once(i, batch, js, measuring)
        else:
            self._route_one_by_one(i, batch, js.tolist(), measuring)

    def _route_one_by_one(self, i: int, batch: list[int], js: list[int], measuring: bool) -> None:
        """Each row of model i's step: its token, the what-ifs' bookkeeping, and its request's end, hop or next
        step."""
        now, gets, hop_ms, enqueue = self.now, self.c_rows[i], self.hop_ms, self._enqueue
        tokens_of, limit_of, first_at, transit = self.tokens_of, self.limit_of, self.first_at, self.transit
        opened, ending, whatif = self.opened, self.ending, self.whatif
        tokens = self.tokens  # (summed in the same order)
        for r, j in zip(batch, js, strict=True):
            got = gets[j]
            if opened and got > 0 and tokens_of[r] == 0:
                first_at[r] = now
            tokens_of[r] += got
            if measuring:
                tokens += got
            if whatif:
                self._note_leaving(i, r, j)
            if ending and tokens_of[r] >= limit_of[r]:
                if self._end_request(r):
                    enqueue(self.entry, [r])
            elif j != i and hop_ms[j] > 0:
                heapq.heappush(transit, (now + hop_ms[j], r, j, [r]))
            else:
                enqueue(j, [r])
        self.tokens = tokens

    def _note_leaving(self, i: int, r: int, j: int) -> None:
        """The what-ifs' bookkeeping of row r of model i's step going to model j: when it last left i
        (`held_away_ms`), how often it left i (`held_expect`)."""
        if self.away is not None:
            if j != i:
                self.left[i][r] = self.now
            else:
                self.left[i].pop(r, None)
        if self.expect is not None and j != i:
            self.leaves[i][r] = self.leaves[i].get(r, 0) + 1

    def _route_at_once(self, i: int, batch: list[int], js: np.ndarray, measuring: bool) -> None:
        """The rows at once: the same bookkeeping as `_route_one_by_one`, in the same order where order matters
        (the requests that end; each queue's rows)."""
        now, tokens_of, entry = self.now, self.tokens_of, self.entry
        rows, gots = np.asarray(batch), self.inputs.c[i][js]
        if self.opened:
            for r in rows[(gots > 0) & (tokens_of[rows] == 0)].tolist():
                self.first_at[r] = now
        if self.ending:
            tokens_of[rows] += gots
        if measuring:
            self.tokens += float(gots.sum())
        ends = tokens_of[rows] >= self.limit_of[rows] if self.ending else np.zeros(len(batch), dtype=bool)
        back = np.zeros(len(batch), dtype=bool)  # an ended slot that takes a request waiting
        for k in np.flatnonzero(ends).tolist():
            back[k] = self._end_request(batch[k])  # queued below, in its place among the batch's rows
        for j in range(self.m):
            to_j = ~ends & (js == j)
            if j != i and self.hop_ms[j] > 0:
                if hops := sorted(rows[to_j].tolist()):
                    heapq.heappush(self.transit, (now + self.hop_ms[j], hops[0], j, hops))
                to_j = back if j == entry else None
            elif j == entry:
                to_j |= back
            if to_j is not None and to_j.any():
                self._enqueue(j, rows[to_j].tolist())

    def _end_request(self, r: int) -> bool:
        """Request slot r's request has committed its tokens: it leaves, and the slot takes what comes next (a
        request waiting at the cap: True, to be queued at the entry; or one after a think time)."""
        cfg, now = self.cfg, self.now
        self.finished += 1
        self.active -= 1
        for h in (*self.held, *self.prefilled):
            h.discard(r)
        for per_model in (*self.left, *self.first, *self.leaves):
            per_model.pop(r, None)
        self.tokens_of[r] = 0.0
        if self.opened:
            return self._take_waiting(r)
        if cfg.requests is None:
            heapq.heappush(self.returns, (now + self.think(), r))
        elif self.next_req < len(cfg.requests):  # the slot takes the next request
            self.req_of[r], self.next_req = self.next_req, self.next_req + 1
            if cfg.request_lengths:
                self.limit_of[r] = cfg.request_lengths[self.next_req - 1]
            heapq.heappush(self.returns, (now + self.think(), r))
        return False

    def _take_waiting(self, r: int) -> bool:
        """An open loop's slot r is free: a measured request's latencies are kept, and the oldest request
        waiting at the cap takes the slot (True), else it is free."""
        arrived_at, started_at, first_at = self.arrived_at, self.started_at, self.first_at
        if arrived_at[r] >= self.warmup:
            self.done.append((arrived_at[r], started_at[r], first_at[r], self.now))
        if self.backlog:
            arrived_at[r], started_at[r], first_at[r] = self.backlog.popleft(), self.now, math.inf
            self.active += 1
            return True
        self.free.append(r)
        return False

    def _deliver_hops(self) -> None:
        """Queue the hops due, in (time, request slot) order."""
        arrived = []
        while self.transit and self.transit[0][0] <= self.now + _EPS:
            arrived.append(heapq.heappop(self.transit))
        if len(arrived) == 1:  # one step's hops to one model, in order already
            self._enqueue(arrived[0][2], arrived[0][3])
        elif arrived:
            for _, r, j in sorted((t, r, j) for t, _, j, rs in arrived for r in rs):
                self._enqueue(j, [r])

    def _take_returns_and_arrivals(self) -> None:
        """Queue at the entry the requests back from their think time, and an open loop's arrivals (in a free
        slot, else into the backlog)."""
        now = self.now
        while self.returns and self.returns[0][0] <= now + _EPS:
            _, r = heapq.heappop(self.returns)
            self._enqueue(self.entry, [r])
            self.active += 1
        while self.next_arrival <= now + _EPS:
            if self.free:
                r = self.free.pop()
                self.arrived_at[r], self.started_at[r], self.first_at[r] = self.next_arrival, now, math.inf
                self._enqueue(self.entry, [r])
                self.active += 1
            else:
                self.backlog.append(self.next_arrival)
            self.next_arrival = self._following()

    def result(self) -> SimResult:
        cfg, m = self.cfg, self.m
        if cfg.requests is not None:
            span = self.now
        else:
            span = max(self.now - self.warmup, 0.0) if self.stalled or self.drained else cfg.horizon_ms
        span = span or 1.0
        busy = self.busy
        return SimResult(
            thresholds=tuple(cfg.thresholds),
            throughput=self.tokens / span * 1000.0,
            tokens=self.tokens,
            time_ms=span,
            utilization=tuple(float(x) for x in busy / span),
            mean_batch=tuple(
                float(x) for x in np.divide(self.batch_time, busy, out=np.zeros(m), where=busy > 0)
            ),
            mean_queue=tuple(float(x) for x in self.queue_time / span),
            steps_per_s=tuple(float(x) for x in self.steps / span * 1000.0),
            steps_by_batch=tuple(dict(sorted(d.items())) for d in self.by_batch),
            finished_requests=self.finished,
            stalled=self.stalled,
            latency=self._latency() if self.opened else None,
        )

    def _latency(self) -> dict:
        """An open loop's latencies over its measured requests (arrived after the warm-up, ended in the
        horizon), ms; and the measured arrivals that had not ended (in flight, or waiting at the cap)."""
        done, warmup, arrived_at = self.done, self.warmup, self.arrived_at
        later = self.cfg.request_tokens - 1  # the tokens after the first
        busy_slots = sorted(set(range(self.slots)) - set(self.free))
        return {
            "measured": len(done),
            "queued_ms": _spread([s - a for a, s, _, _ in done]),
            "ttft_ms": _spread([f - s for _, s, f, _ in done]),
            "tpot_ms": _spread([(e - f) / later for _, _, f, e in done] if later > 0 else []),
            "e2e_ms": _spread([e - s for _, s, _, e in done]),
            "from_arrival_ms": _spread([e - a for a, _, _, e in done]),
            "unfinished": sum(1 for a in self.backlog if a >= warmup)
            + sum(1 for r in busy_slots if arrived_at[r] >= warmup),
            "backlog": len(self.backlog),
        }


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "p50": math.nan, "p99": math.nan}
    xs = np.asarray(values)
    return {
        "mean": float(xs.mean()),
        "p50": float(np.percentile(xs, 50)),
        "p99": float(np.percentile(xs, 99)),
    }
