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
from dataclasses import dataclass

import numpy as np

from tokenrouter.throughput.inputs import SystemInputs

_EPS = 1e-9  # ms: events closer than this are simultaneous
# a step's rows this many or more are routed with numpy at once (fewer: one by one, which is faster for them)
_ROWS_AT_ONCE = 32


@dataclass(slots=True)
class SimConfig:
    thresholds: tuple[int, ...]
    horizon_ms: float = 60_000.0  # simulated time measured (after the warm-up)
    warmup_ms: float = 2_000.0
    seed: int = 0
    request_tokens: int | None = None  # None: requests never finish (the chain's closed system)
    think_ms: float = 0.0
    burstiness: float = 1.0  # squared coefficient of variation of think times (>= 1)
    max_delay_ms: float | None = None  # None: no timeout
    requests: tuple[np.ndarray, ...] | None = None  # a finite run: each request's own routing matrix
    # a finite run's requests' own token counts, in their order (None: `request_tokens` each)
    request_lengths: tuple[int, ...] | None = None
    hop_ms: tuple[float, ...] | None = None  # per target model: a hop's transit to it; None: instant
    # per model, host time each step takes beyond its step latency (the loop's gap between back-to-back steps,
    # `tokenrouter_step_gap_seconds_total`, the profile's `workload.gap_ms`); None: none
    gap_ms: tuple[float, ...] | None = None
    # the runtime's rule that a model also steps when every request it holds (has run and not seen end) is
    # queued there (`runtime.subserver.batching`, "Nobody else to wait for"); False: as servers before it did
    held_rule: bool = True
    # a what-if refinement of that rule (not in the runtime): a request away from a model for longer than this
    # no longer counts as held there (None: it counts until it ends, as the runtime has it)
    held_away_ms: float | None = None
    # another what-if: step once the requests away are expected to bring fewer than this many rows back within
    # what is left of the timeout, each at its own rate of leaving the model (times left / time since its first
    # step there), as a Poisson process: sum of 1 - exp(-rate * left_ms) (None: the runtime's rule)
    held_expect: float | None = None
    # an open loop: requests arrive at this rate (Poisson), at most N in flight (None: a closed loop)
    arrival_rate_per_s: float | None = None
    # an open loop's arrival times instead, ms, ascending: the same arrivals for runs at other thresholds
    # (`rate_tune`), or a served run's (`workload.read_arrivals`); the run ends when the last one's request has
    # ended, or at the horizon
    arrivals_ms: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not self.thresholds or any(not isinstance(b, int) or b < 1 for b in self.thresholds):
            raise ValueError(f"thresholds must be ints >= 1, got {self.thresholds!r}")
        for name in ("horizon_ms", "warmup_ms", "think_ms"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.horizon_ms <= 0:
            raise ValueError("horizon_ms must be > 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if self.request_tokens is not None and (
            not isinstance(self.request_tokens, int) or self.request_tokens < 1
        ):
            raise ValueError(f"request_tokens must be an int >= 1 or None, got {self.request_tokens!r}")
        if not (
            isinstance(self.burstiness, (int, float))
            and self.burstiness >= 1
            and math.isfinite(self.burstiness)
        ):
            raise ValueError(
                f"burstiness (squared coefficient of variation) must be >= 1, got {self.burstiness!r}"
            )
        if self.max_delay_ms is not None and not (
            self.max_delay_ms >= 0 and math.isfinite(self.max_delay_ms)
        ):
            raise ValueError(f"max_delay_ms must be a finite number >= 0, got {self.max_delay_ms!r}")
        if self.held_away_ms is not None and not (
            self.held_rule and self.held_away_ms >= 0 and math.isfinite(self.held_away_ms)
        ):
            raise ValueError(
                f"held_away_ms must be a finite number >= 0 with held_rule, got {self.held_away_ms!r}"
            )
        if self.held_expect is not None and not (
            self.held_rule
            and self.held_away_ms is None
            and self.max_delay_ms is not None
            and self.held_expect > 0
            and math.isfinite(self.held_expect)
        ):
            raise ValueError(
                "held_expect must be a finite number > 0, with held_rule and max_delay_ms and without "
                f"held_away_ms, got {self.held_expect!r}"
            )
        for name in ("hop_ms", "gap_ms"):
            if (v := getattr(self, name)) is not None:
                setattr(self, name, tuple(float(x) for x in v))
                if any(not (math.isfinite(x) and x >= 0) for x in getattr(self, name)):
                    raise ValueError(f"{name} must be finite numbers >= 0, got {v!r}")
        if self.requests is not None:
            if self.request_tokens is None or not self.requests:
                raise ValueError("requests (a finite run) needs request_tokens and at least one request")
            self.requests = tuple(np.asarray(p, dtype=float) for p in self.requests)
        if self.arrival_rate_per_s is not None and not (
            math.isfinite(self.arrival_rate_per_s) and self.arrival_rate_per_s > 0
        ):
            raise ValueError(f"the arrival rate must be a finite number > 0, got {self.arrival_rate_per_s!r}")
        if self.arrivals_ms is not None:
            self.arrivals_ms = tuple(float(x) for x in self.arrivals_ms)
            if self.arrival_rate_per_s is not None:
                raise ValueError("an open loop takes an arrival rate or arrival times, not both")
            if any(not (math.isfinite(x) and x >= 0) for x in self.arrivals_ms) or any(
                b < a for a, b in zip(self.arrivals_ms, self.arrivals_ms[1:], strict=False)
            ):
                raise ValueError("arrival times must be finite numbers of ms >= 0, in ascending order")
        if self.arrival_rate_per_s is not None or self.arrivals_ms is not None:
            if self.request_tokens is None or self.requests is not None or self.think_ms > 0:
                raise ValueError(
                    "an open loop (an arrival rate) needs request_tokens, and takes neither requests (a finite run)"
                    " nor think_ms (a closed loop's)"
                )
        if self.request_lengths is not None:
            self.request_lengths = tuple(self.request_lengths)
            if self.requests is None or len(self.request_lengths) != len(self.requests):
                raise ValueError("request_lengths needs requests (a finite run), one length each")
            if any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in self.request_lengths):
                raise ValueError(f"request_lengths must be ints >= 1, got {self.request_lengths!r}")


@dataclass(slots=True)
class SimResult:
    thresholds: tuple[int, ...]
    throughput: float  # committed tokens per second
    tokens: float
    time_ms: float
    utilization: tuple[float, ...]
    mean_batch: tuple[float, ...]
    mean_queue: tuple[float, ...]
    steps_per_s: tuple[float, ...]
    steps_by_batch: tuple[dict[int, int], ...]  # per model, the measured steps by their rows
    finished_requests: int
    stalled: bool  # every model idle with nothing able to start (only without a timeout)
    # an open loop's: {"queued_ms"|"ttft_ms"|"tpot_ms"|"e2e_ms"|"from_arrival_ms": {"mean", "p50", "p99"},
    # "measured": requests, "unfinished": measured arrivals not ended, "backlog": waiting at the cap at the end}
    latency: dict | None = None

    def as_dict(self, models: tuple[str, ...]) -> dict:
        return {
            "thresholds": dict(zip(models, self.thresholds, strict=True)),
            "throughput_tok_s": self.throughput,
            "simulated_ms": self.time_ms,
            "utilization": dict(zip(models, self.utilization, strict=True)),
            "mean_batch": dict(zip(models, self.mean_batch, strict=True)),
            "mean_queue": dict(zip(models, self.mean_queue, strict=True)),
            "steps_per_s": dict(zip(models, self.steps_per_s, strict=True)),
            "steps_by_batch": {
                m: {str(b): k for b, k in d.items()} for m, d in zip(models, self.steps_by_batch, strict=True)
            },
            "finished_requests": self.finished_requests,
            "stalled": self.stalled,
            **({"latency": self.latency} if self.latency is not None else {}),
        }


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


# the most steps `steps_error` lets a run simulate: each takes some µs of Python, so 1e8 of them take hours
MAX_SIM_STEPS = 100_000_000


def steps_error(inputs: SystemInputs, cfg: SimConfig) -> str | None:
    """The message when the run's simulated time (warm-up and horizon) allows more than `MAX_SIM_STEPS` steps,
    each model stepping back to back at its shortest step; None otherwise, and for a finite run (`requests`),
    which ends with its last request."""
    if cfg.requests is not None:
        return None
    lone = inputs.alone or (None,) * inputs.n_models
    per_ms = sum(  # steps per ms at most
        1.0 / min(ms for _, ms in (*s.points, *(a.step.points if a is not None else ())))
        for s, a in zip(inputs.step, lone, strict=True)
    )
    steps = (cfg.warmup_ms + cfg.horizon_ms) * per_ms
    if steps <= MAX_SIM_STEPS:
        return None
    most = MAX_SIM_STEPS / per_ms - cfg.warmup_ms
    return (
        f"--horizon-ms {cfg.horizon_ms:g} after --warmup-ms {cfg.warmup_ms:g} could take up to {steps:.3g} "
        f"steps of the models at their shortest step latencies, more than the {MAX_SIM_STEPS:.0e} a run may "
        + (f"simulate: give --horizon-ms {most:.6g} or less" if most > 0 else "simulate: shorten --warmup-ms")
    )


def simulate(inputs: SystemInputs, cfg: SimConfig) -> SimResult:
    m, n = inputs.n_models, inputs.concurrency
    if len(cfg.thresholds) != m:
        raise ValueError(f"expected {m} thresholds, got {len(cfg.thresholds)}")
    if cfg.hop_ms is not None and len(cfg.hop_ms) != m:
        raise ValueError(f"expected {m} hop delays, got {len(cfg.hop_ms)}")
    if cfg.gap_ms is not None and len(cfg.gap_ms) != m:
        raise ValueError(f"expected {m} step gaps, got {len(cfg.gap_ms)}")
    hop_ms = cfg.hop_ms or (0.0,) * m
    host_ms = cfg.gap_ms or (0.0,) * m  # each step's host time beyond its latency
    c_rows = inputs.c.tolist()  # c_ij as floats: the per-row loop reads them
    ending = cfg.request_tokens is not None  # requests end (an open loop's too: it needs request_tokens)
    rng = np.random.default_rng(cfg.seed)
    think = _think_sampler(cfg, rng)
    # a request slot r (0..N-1) holds request req_of[r]; without `requests` every request routes by p
    if cfg.requests is None:
        cums, req_of, warmup = [np.cumsum(inputs.p, axis=1)], [0] * n, cfg.warmup_ms
    else:
        for k, p in enumerate(cfg.requests):
            if p.shape != (m, m) or np.any(p < 0) or not np.allclose(p.sum(axis=1), 1.0, atol=1e-6):
                raise ValueError(f"request {k}: routing must be {m}x{m}, non-negative, rows summing to 1")
        cums, warmup = [np.cumsum(p, axis=1) for p in cfg.requests], 0.0
        req_of = list(range(min(n, len(cfg.requests))))
    next_req = len(req_of) if cfg.requests is not None else 0  # the next request to start, finite run
    slots = len(req_of)
    # an open loop: slots start free, requests arrive (Poisson at the rate, or at the times given)
    opened = cfg.arrival_rate_per_s is not None or cfg.arrivals_ms is not None
    if cfg.arrivals_ms is not None:
        given = iter((*cfg.arrivals_ms, math.inf))
        following = lambda: next(given)  # noqa: E731
        next_arrival = next(given)
    else:
        gap_ms = 1000.0 / cfg.arrival_rate_per_s if opened else math.inf
        following = lambda: next_arrival + float(rng.exponential(gap_ms))  # noqa: E731
        next_arrival = 0.0 if opened else math.inf
    # an open loop's free slots (popped from the end), the arrival times of the requests waiting at the cap
    # (oldest first), each slot's request's arrival, start and first token, and the measured requests' (arrival,
    # start, first token, end)
    free = list(range(slots - 1, -1, -1)) if opened else []
    backlog: deque[float] = deque()
    arrived_at, started_at, first_at = [0.0] * slots, [0.0] * slots, [math.inf] * slots
    done: list[tuple[float, float, float, float]] = []
    # per model, the request slots queued there (in the order they came), and since when the first has waited
    queue: list[list[int]] = [[] for _ in range(m)]
    since = [0.0] * m
    running: list[list[int]] = [[] for _ in range(m)]
    end = [math.inf] * m
    # each slot's tokens committed in its request, and the count at which its request ends
    tokens_of = np.zeros(slots)
    limit_of = np.array(
        [cfg.request_lengths[req_of[r]] for r in range(slots)]
        if cfg.request_lengths
        else [cfg.request_tokens or math.inf] * slots,
        dtype=float,
    )
    returns: list[tuple[float, int]] = []  # a heap of (time, request slot) of requests thinking
    # a heap of the hops on their way, a step's to one model together: (arrival time, the first request slot,
    # model, the request slots in order)
    transit: list[tuple[float, int, int, list[int]]] = []
    queue[inputs.entry] = [] if opened else list(range(slots))
    # per model, the request slots it ran that have not ended (`held_rule`)
    held: list[set[int]] = [set() for _ in range(m)]
    left: list[dict[int, float]] = [{} for _ in range(m)]  # per model, when each request it held last left it
    away, expect = cfg.held_away_ms, cfg.held_expect
    whatif = away is not None or expect is not None  # the what-ifs keep a row's bookkeeping each
    first: list[dict[int, float]] = [{} for _ in range(m)]  # per model, when each request first stepped there
    # per model, the ms a request's first step there adds (its prompt prefill), and the slots that have had it
    visit_ms = [(c.ms_per_visit or 0.0) if (c := inputs.prefill_at(i)) is not None else 0.0 for i in range(m)]
    prefilled: list[set[int]] = [set() for _ in range(m)]
    leaves: list[dict[int, int]] = [{} for _ in range(m)]  # per model, how often each request left it
    active = 0 if opened else slots
    now = 0.0
    t_end = warmup + cfg.horizon_ms
    tokens = 0.0
    busy = np.zeros(m)
    batch_time = np.zeros(m)
    queue_time = np.zeros(m)
    steps = np.zeros(m)
    by_batch: list[dict[int, int]] = [{} for _ in range(m)]  # per model, the measured steps by their rows
    finished = 0
    stalled = drained = False
    eff = tuple(cfg.thresholds)
    eff_at: dict[int, tuple[int, ...]] = {}  # the thresholds in effect at each count of active requests

    def nobody_else(i: int, t: float, waited: float) -> bool:
        """The held rule: model i waits for no request (every request it holds is queued; with `held_away_ms`,
        every one not away that long; with `held_expect`, fewer rows than that expected back in time)."""
        queued = set(queue[i])
        if expect is not None:
            window = cfg.max_delay_ms - waited
            due = 0.0
            for r in held[i] - queued:
                since = t - first[i].get(r, t)
                due += 1.0 if since <= _EPS else 1.0 - math.exp(-leaves[i].get(r, 0) / since * window)
            return due < expect
        if away is None:
            return held[i] <= queued
        return {r for r in held[i] if t - left[i].get(r, t) < away - _EPS} <= queued

    def enqueue(j: int, rs: list[int]) -> None:
        """Queue request slots rs at model j, in order (the first in an empty queue waits from now)."""
        if not queue[j]:
            since[j] = now
        queue[j].extend(rs)

    def end_request(r: int) -> bool:
        """Request slot r's request has committed its tokens: it leaves, and the slot takes what comes next (a
        request waiting at the cap: True, to be queued at the entry; or one after a think time)."""
        nonlocal finished, active, next_req
        finished += 1
        active -= 1
        for h in (*held, *prefilled):
            h.discard(r)
        for per_model in (*left, *first, *leaves):
            per_model.pop(r, None)
        tokens_of[r] = 0.0
        if opened:
            if arrived_at[r] >= warmup:
                done.append((arrived_at[r], started_at[r], first_at[r], now))
            if backlog:  # the oldest request waiting at the cap takes the slot
                arrived_at[r], started_at[r], first_at[r] = backlog.popleft(), now, math.inf
                active += 1
                return True
            free.append(r)
        elif cfg.requests is None:
            heapq.heappush(returns, (now + think(), r))
        elif next_req < len(cfg.requests):  # the slot takes the next request
            req_of[r], next_req = next_req, next_req + 1
            if cfg.request_lengths:
                limit_of[r] = cfg.request_lengths[next_req - 1]
            heapq.heappush(returns, (now + think(), r))
        return False

    def start_ready(t: float) -> None:
        new = []
        for i in range(m):
            if running[i] or not queue[i]:
                continue
            waited = t - since[i]
            if (
                len(queue[i]) >= eff[i]
                or (cfg.max_delay_ms is not None and waited >= cfg.max_delay_ms - _EPS)
                or (cfg.held_rule and nobody_else(i, t, waited))
            ):
                running[i], queue[i] = queue[i], []
                new.append(i)
        busy_now = [bool(x) for x in running]  # the steps starting now run beside each other
        for i in new:
            end[i] = t + inputs.step_at(i, len(running[i]), busy_now)
            if host_ms[i]:
                end[i] += host_ms[i]
            if visit_ms[i]:
                fresh = [r for r in running[i] if r not in prefilled[i]]
                end[i] += visit_ms[i] * len(fresh)
                prefilled[i].update(fresh)

    start_ready(now)
    while now < t_end:
        candidates = [e for e in end if e < math.inf]
        if returns:
            candidates.append(returns[0][0])
        if transit:
            candidates.append(transit[0][0])
        if opened:
            candidates.append(next_arrival)
        if cfg.max_delay_ms is not None:
            for i in range(m):
                if not running[i] and queue[i]:
                    candidates.append(since[i] + cfg.max_delay_ms)
        if away is not None:  # a waiting model stops waiting for a request once it has been away that long
            for i in range(m):
                if not running[i] and queue[i]:
                    gone = [
                        left[i][r] + away for r in held[i] if r in left[i] and left[i][r] + away > now + _EPS
                    ]
                    if gone:
                        candidates.append(min(gone))
        # what the requests away are expected to bring shrinks as time passes: a waiting model looks again
        if expect is not None and any(not running[i] and queue[i] for i in range(m)):
            candidates.append(now + 0.5)
        if not candidates:
            stalled = True
            break
        nxt = min(min(candidates), t_end)
        lo, hi = max(now, warmup), nxt
        if hi > lo:
            for i in range(m):
                if running[i]:
                    busy[i] += hi - lo
                    batch_time[i] += (hi - lo) * len(running[i])
                queue_time[i] += (hi - lo) * len(queue[i])
        now = nxt
        if now >= t_end:
            break
        measuring = now > warmup or cfg.requests is not None
        for i in range(m):
            if end[i] <= now + _EPS:
                batch, running[i], end[i] = running[i], [], math.inf
                held[i].update(batch)
                if expect is not None:
                    for r in batch:
                        first[i].setdefault(r, now)
                if measuring:
                    steps[i] += 1
                    by_batch[i][len(batch)] = by_batch[i].get(len(batch), 0) + 1
                us = rng.random(len(batch))
                if len(cums) == 1:  # every request routes alike: one search for the whole batch
                    dests = cums[0][i].searchsorted(us * cums[0][i][-1], side="right")
                else:
                    dests = [cums[req_of[r]][i].searchsorted(u * cums[req_of[r]][i][-1], side="right")
                             for r, u in zip(batch, us, strict=True)]  # fmt: skip
                js = np.minimum(dests, m - 1)
                if len(batch) >= _ROWS_AT_ONCE and not whatif:
                    # the rows at once: the same bookkeeping as the loop below, in the same order where order
                    # matters (the requests that end; each queue's rows)
                    rows, gots = np.asarray(batch), inputs.c[i][js]
                    if opened:
                        for r in rows[(gots > 0) & (tokens_of[rows] == 0)].tolist():
                            first_at[r] = now
                    if ending:
                        tokens_of[rows] += gots
                    if measuring:
                        tokens += float(gots.sum())
                    ends = tokens_of[rows] >= limit_of[rows] if ending else np.zeros(len(batch), dtype=bool)
                    back = np.zeros(len(batch), dtype=bool)  # an ended slot that takes a request waiting
                    for k in np.flatnonzero(ends).tolist():
                        back[k] = end_request(batch[k])  # queued below, in its place among the batch's rows
                    for j in range(m):
                        to_j = ~ends & (js == j)
                        if j != i and hop_ms[j] > 0:
                            if hops := sorted(rows[to_j].tolist()):
                                heapq.heappush(transit, (now + hop_ms[j], hops[0], j, hops))
                            to_j = back if j == inputs.entry else None
                        elif j == inputs.entry:
                            to_j |= back
                        if to_j is not None and to_j.any():
                            enqueue(j, rows[to_j].tolist())
                    continue
                gets = c_rows[i]
                for r, j in zip(batch, js.tolist(), strict=True):
                    got = gets[j]
                    if opened and got > 0 and tokens_of[r] == 0:
                        first_at[r] = now
                    tokens_of[r] += got
                    if measuring:
                        tokens += got
                    # the what-ifs' bookkeeping, only where one is asked for
                    if away is not None:
                        if j != i:
                            left[i][r] = now
                        else:
                            left[i].pop(r, None)
                    if expect is not None and j != i:
                        leaves[i][r] = leaves[i].get(r, 0) + 1
                    if ending and tokens_of[r] >= limit_of[r]:
                        if end_request(r):
                            enqueue(inputs.entry, [r])
                    elif j != i and hop_ms[j] > 0:
                        heapq.heappush(transit, (now + hop_ms[j], r, j, [r]))
                    else:
                        enqueue(j, [r])
        arrived = []  # the hops due, queued in (time, request slot) order
        while transit and transit[0][0] <= now + _EPS:
            arrived.append(heapq.heappop(transit))
        if len(arrived) == 1:  # one step's hops to one model, in order already
            enqueue(arrived[0][2], arrived[0][3])
        elif arrived:
            for _, r, j in sorted((t, r, j) for t, _, j, rs in arrived for r in rs):
                enqueue(j, [r])
        while returns and returns[0][0] <= now + _EPS:
            _, r = heapq.heappop(returns)
            enqueue(inputs.entry, [r])
            active += 1
        while next_arrival <= now + _EPS:  # an open loop's arrivals: a free slot, else the backlog
            if free:
                r = free.pop()
                arrived_at[r], started_at[r], first_at[r] = next_arrival, now, math.inf
                enqueue(inputs.entry, [r])
                active += 1
            else:
                backlog.append(next_arrival)
            next_arrival = following()
        if cfg.requests is not None and finished == len(cfg.requests):
            break  # the finite run's makespan
        if next_arrival == math.inf and opened and active == 0 and not backlog:
            drained = True  # the given arrivals are over and every one of their requests has ended
            break
        if active not in eff_at:
            full = tuple(cfg.thresholds)
            eff_at[active] = effective_thresholds(full, active) if active < n else full
        eff = eff_at[active]
        start_ready(now)
    if cfg.requests is not None:
        span = now
    else:
        span = max(now - warmup, 0.0) if stalled or drained else cfg.horizon_ms
    span = span or 1.0
    return SimResult(
        thresholds=tuple(cfg.thresholds),
        throughput=tokens / span * 1000.0,
        tokens=tokens,
        time_ms=span,
        utilization=tuple(float(x) for x in busy / span),
        mean_batch=tuple(float(x) for x in np.divide(batch_time, busy, out=np.zeros(m), where=busy > 0)),
        mean_queue=tuple(float(x) for x in queue_time / span),
        steps_per_s=tuple(float(x) for x in steps / span * 1000.0),
        steps_by_batch=tuple(dict(sorted(d.items())) for d in by_batch),
        finished_requests=finished,
        stalled=stalled,
        latency=_latency(done, cfg, warmup, backlog, sorted(set(range(slots)) - set(free)), arrived_at)
        if opened
        else None,
    )


def _latency(
    done, cfg: SimConfig, warmup: float, backlog: deque[float], busy_slots: list[int], arrived_at
) -> dict:
    """An open loop's latencies over its measured requests (arrived after the warm-up, ended in the horizon),
    ms; and the measured arrivals that had not ended (in flight, or waiting at the cap)."""

    def spread(values: list[float]) -> dict[str, float]:
        if not values:
            return {"mean": math.nan, "p50": math.nan, "p99": math.nan}
        xs = np.asarray(values)
        return {
            "mean": float(xs.mean()),
            "p50": float(np.percentile(xs, 50)),
            "p99": float(np.percentile(xs, 99)),
        }

    later = cfg.request_tokens - 1  # the tokens after the first
    return {
        "measured": len(done),
        "queued_ms": spread([s - a for a, s, _, _ in done]),
        "ttft_ms": spread([f - s for _, s, f, _ in done]),
        "tpot_ms": spread([(e - f) / later for _, _, f, e in done] if later > 0 else []),
        "e2e_ms": spread([e - s for _, s, _, e in done]),
        "from_arrival_ms": spread([e - a for a, _, _, e in done]),
        "unfinished": sum(1 for a in backlog if a >= warmup)
        + sum(1 for r in busy_slots if arrived_at[r] >= warmup),
        "backlog": len(backlog),
    }
