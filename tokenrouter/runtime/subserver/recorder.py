"""The scheduler's accounting, beside its loop: `StepRecorder` times each step, counts what it ran (by batch size,
by shape, the stalls, the steps no co-runner overlapped, the host gaps between steps), the hops received and their
delay, and makes the subserver's `SubserverStats` from its totals and the engine's.

The scheduler calls, per step: `begin(reason)` before it runs the batch, `note_first_runs` and `note_ran` around
each engine forward, `leave_board()` once the batch has run (also when it raised), `end(rows)` after a step that
completed (which returns the step's end, the hops' send time), and `mark_ready()` where the next step could start
at once.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.engine import kernel_loads
from tokenrouter.runtime.subserver.busy_board import BusyBoard

logger = logging.getLogger(__name__)

# A step counts as a *stall* when it takes over SLOW_STEP_FLOOR_MS and over SLOW_STEP_FACTOR x what the earlier
# steps make it expect: the mean step of its batch size (or of all steps, while its batch size has fewer than
# SLOW_STEP_MIN_HISTORY), scaled up by its new tokens over that mean's (a long prefill is work, not a stall).
# Stalls are counted apart (`/metrics`: tokenrouter_slow_steps_by_batch_total) and logged with their shape: one
# 1.1 s stall of every request in flight cost a benchmark run 10 % on the H200, and one inside a profile window
# made a batch size's mean step 50 % longer.
SLOW_STEP_FACTOR = 10.0
SLOW_STEP_FLOOR_MS = 50.0
SLOW_STEP_MIN_HISTORY = 20
SLOW_STEP_LOG_FIRST = 20  # stalls logged one by one; after that every 100th


def expected_step_ms(
    tokens: int, same_bs: tuple[float, float, float], every: tuple[float, float, float]
) -> float | None:
    """What the earlier steps of its batch size (or of every batch size, while that one has too few), each given
    as (steps, ms, tokens) totals, make a step of `tokens` new tokens expect; None without enough history."""
    steps, total_ms, total_tokens = same_bs if same_bs[0] >= SLOW_STEP_MIN_HISTORY else every
    if steps < SLOW_STEP_MIN_HISTORY:
        return None
    return total_ms / steps * max(1.0, tokens * steps / max(total_tokens, 1.0))


def is_stall(
    ms: float, tokens: int, same_bs: tuple[float, float, float], every: tuple[float, float, float]
) -> bool:
    """Whether a step of `ms` and `tokens` new tokens stalled (see SLOW_STEP_FACTOR)."""
    if ms <= SLOW_STEP_FLOOR_MS:
        return False
    expected = expected_step_ms(tokens, same_bs, every)
    return expected is not None and ms > SLOW_STEP_FACTOR * expected


def tally(total: list[float], ms: float, tokens: int) -> None:
    """Add one step of `ms` and `tokens` new tokens to a [steps, ms, new tokens] total."""
    total[0] += 1
    total[1] += ms
    total[2] += tokens


def q_class(q: int) -> int:
    """A step's longest row's new tokens, rounded up to a power of two: 1 is a decode step, 2-64 the extends of
    returning hops that the CUDA graphs capture by default (cuda_graph_runner.DEFAULT_EXTEND_LENS), longer ones
    prefills. Steps of one batch size differ in cost by it: a graph of (bs, q) pads every row to q tokens."""
    return 1 << max(0, int(q) - 1).bit_length()


def _by_shape_key(table: dict[tuple[int, int, str], list[float]]) -> dict[str, tuple[int, float, int]]:
    """A (batch size, q, overlap) -> [steps, ms, count] table as `StepTables` carries it: keys "BS/Q/OVERLAP"."""
    return {f"{bs}/{q}/{o}": (int(n), ms, int(k)) for (bs, q, o), (n, ms, k) in table.items()}


def _by_bs(table: dict[int, list[float]]) -> dict[int, tuple[int, float, int]]:
    return {bs: (int(n), ms, int(k)) for bs, (n, ms, k) in table.items()}


PREFIX_COUNTERS = ("matched_tokens", "computed_tokens", "arrivals", "cached_blocks", "cached_tokens",
                   "evicted_blocks", "waited_rows")  # fmt: skip


def kv_stats(es: dict) -> m.KvStats:
    """The engine's KV pool counters (`Engine.stats()`), less the scheduler's deferred rows."""
    return m.KvStats(
        pages_total=int(es.get("pages_total", 0)),
        pages_free=int(es.get("pages_free", 0)),
        evictions=int(es.get("evictions", 0)),
        reprefills=int(es.get("reprefills", 0)),
    )


def prefix_stats(es: dict) -> m.PrefixCacheStats:
    """The engine's prefix-cache counters (runtime/prefix_cache.py; none without a prefix cache)."""
    counts = {name: int(es.get(f"prefix_{name}", 0)) for name in PREFIX_COUNTERS}
    return m.PrefixCacheStats(enabled=bool(es.get("prefix_cache", False)), **counts)


class StepRecorder:
    """Exact totals since start, for /metrics and the benchmarks (a step's time includes the route kernel)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.init_totals()
        self.init_tables()
        self.init_between_steps()
        self.init_step_state()
        # the Triton kernels this process built (compiled, or loaded from the disk cache) since this scheduler
        # started: a first-time build in an eager step is a stall of about half a second (kernel_loads.py)
        self.kernel_loads = kernel_loads.LOADS
        kernel_loads.install(self.kernel_loads)
        self._loads_at_start = self.kernel_loads.snapshot()
        self.started = time.perf_counter()  # busy_ms's clock: the busy share over any window of stats

    def init_totals(self) -> None:
        self.steps = 0
        self.last_batch_size = 0
        self.last_step_ms = 0.0
        self.busy_ms = 0.0
        self.rows_total = 0
        # tokens the engine ran: prefill + extend suffixes + one per decode row, as the engine counts them
        # (`StepOutput.stats["tokens"]`: without a prefix cache's matches, with an evicted request's re-prefill)
        self.new_tokens_total = 0
        self.step_starts: dict[str, int] = {}  # why each step started (`DelayedBatching.start_reason`)

    def init_tables(self) -> None:
        self.step_ms_by_bs: dict[int, list[float]] = {}  # batch size -> [steps, ms, new tokens]
        self.slow_ms_by_bs: dict[int, list[float]] = {}  # the stalls among them (`is_stall`): [steps, ms]
        # with a busy board (models sharing a GPU: busy_board.py), the steps that no co-runner's step
        # overlapped, and not stalls: batch size -> [steps, ms, new tokens]
        self.board: BusyBoard | None = None
        self.alone_ms_by_bs: dict[int, list[float]] = {}
        # every step by its shape: (batch size, new tokens of its longest row rounded up to a power
        # of two (`q_class`), how it overlapped) -> [steps, ms, new tokens]
        self.shape_ms: dict[tuple[int, int, str], list[float]] = {}
        # the steps among them that ran some request's first tokens here (its prompt, or all it had on its first
        # hop here; an eviction's re-prefill happens inside the engine and is not one): same key -> [steps, ms,
        # such rows]; the throughput model prices them per request apart from the other steps (`from_metrics`)
        self.first_shape_ms: dict[tuple[int, int, str], list[float]] = {}

    def init_between_steps(self) -> None:
        # host time between back-to-back steps: a step that ended with the next one ready to start leaves its
        # end here; the next step counts the time since (its hops sent, messages read, the batch chosen)
        self.gaps = 0
        self.gap_ms = 0.0
        self._ready_end: float | None = None
        self.kv_deferred_rows = 0  # rows left out of a step because the KV pool could not hold them (fit_kv)
        # hops received and their delay (`count_hop_delay`), and the last steps' (start, end) on time.monotonic()
        self.hops_in = 0
        self.hop_delay_ms = 0.0
        self._recent_steps: deque[tuple[float, float]] = deque(maxlen=4)

    def init_step_state(self) -> None:
        """What the step running now has done so far (`begin` resets it)."""
        self._ran_tokens = 0  # the engine's count of the tokens it ran (`note_ran`)
        self._ran_longest = 0  # and its longest row's (the step's shape, `q_class`)
        # its rows that ran a request here for the first time (KV from nothing: a prefill)
        self._ran_first = 0
        self._seen: tuple[int, ...] | None = None  # the busy board's counts at the start
        self._alone = False
        self._began = 0.0  # on time.monotonic()
        self._t0 = 0.0  # on time.perf_counter()
        self._loads = (0, 0.0)  # the kernel builds' snapshot at the start

    # ---- one step ----------------------------------------------------------------------------------------

    def begin(self, reason: str) -> None:
        """A step starts, for `reason` (`DelayedBatching.start_reason`)."""
        self.step_starts[reason] = self.step_starts.get(reason, 0) + 1
        self.init_step_state()
        self._seen = self.board.start() if self.board is not None else None
        self._began = time.monotonic()
        self._loads = self.kernel_loads.snapshot()
        self._t0 = time.perf_counter()
        if self._ready_end is not None:
            self.gaps += 1
            self.gap_ms += (self._t0 - self._ready_end) * 1000.0
            self._ready_end = None

    def note_first_runs(self, rows: int) -> None:
        """`rows` of an engine forward that run a request here for the first time."""
        self._ran_first += rows

    def note_ran(self, tokens: int, longest: int) -> None:
        """An engine forward ran `tokens` new tokens, `longest` of them in its longest row."""
        self._ran_tokens += tokens
        self._ran_longest = max(self._ran_longest, longest)

    def leave_board(self) -> None:
        """The step's batch has run (or raised): the busy board learns that this model's step is over."""
        if self.board is not None:
            self._alone = self.board.end(self._seen)

    def end(self, bs: int) -> float:
        """Count the step that ran `bs` rows; returns its end on time.monotonic() (its hops' send time)."""
        new_tokens, q = self._ran_tokens, q_class(self._ran_longest)
        ms = (time.perf_counter() - self._t0) * 1000.0
        self.steps += 1
        self.last_batch_size = bs
        self.last_step_ms = ms
        self.busy_ms += ms
        self.rows_total += bs
        self.new_tokens_total += new_tokens
        acc = self.step_ms_by_bs.setdefault(bs, [0, 0.0, 0])
        every = (self.steps - 1, self.busy_ms - ms, self.new_tokens_total - new_tokens)  # before this step
        if stall := is_stall(ms, new_tokens, tuple(acc), every):
            self.note_stall(bs, new_tokens, ms, expected_step_ms(new_tokens, tuple(acc), every))
        elif self._alone:
            tally(self.alone_ms_by_bs.setdefault(bs, [0, 0.0, 0]), ms, new_tokens)
        untracked = self.board is None
        overlap = "stall" if stall else "untracked" if untracked else "alone" if self._alone else "overlapped"
        tally(self.shape_ms.setdefault((bs, q, overlap), [0, 0.0, 0]), ms, new_tokens)
        if self._ran_first:
            tally(self.first_shape_ms.setdefault((bs, q, overlap), [0, 0.0, 0]), ms, self._ran_first)
        tally(acc, ms, new_tokens)
        ended = time.monotonic()
        self._recent_steps.append((self._began, ended))
        return ended

    def mark_ready(self) -> None:
        """The step that just ended left the next one ready to start: the time until it does is a gap."""
        self._ready_end = time.perf_counter()

    def note_stall(self, bs: int, new_tokens: int, ms: float, expected_ms: float) -> None:
        """Count a stalled step, and log it (the first SLOW_STEP_LOG_FIRST, then every 100th) with the Triton kernel
        builds it held, counted from the builds' snapshot at its start."""
        slow = self.slow_ms_by_bs.setdefault(bs, [0, 0.0])
        slow[0] += 1
        slow[1] += ms
        n = sum(s[0] for s in self.slow_ms_by_bs.values())
        if n <= SLOW_STEP_LOG_FIRST or n % 100 == 0:
            built = kernel_loads.describe(*self.kernel_loads.since(self._loads))
            logger.warning(
                "%s: step %d stalled: %.0f ms at batch size %d (%d new tokens; the earlier steps make it expect "
                "%.1f ms; %s); stall %d on this subserver",
                self.model, self.steps, ms, bs, new_tokens, expected_ms, built, n,
            )  # fmt: skip

    # ---- between steps -----------------------------------------------------------------------------------

    def note_deferred(self, rows: int) -> None:
        """`rows` left out of a step because the KV pool could not hold them (`Scheduler.fit_kv`)."""
        self.kv_deferred_rows += rows

    def count_hop_delay(self, sent_at: float) -> None:
        """Count a hop's delay: from its send (the end of the sender's step, on the host's time.monotonic()) to
        now, when the scheduler takes it in. Where this subserver was in a step when the hop was sent, the hop
        could only join the next step anyway (the throughput model's view), so its delay counts from that step's
        end; a step that started after the send ran without the hop, and its time counts."""
        since = sent_at
        for start, end in self._recent_steps:
            if start <= sent_at < end:
                since = end
        self.hops_in += 1
        self.hop_delay_ms += max(0.0, time.monotonic() - since) * 1000.0

    # ---- the report --------------------------------------------------------------------------------------

    def stats(self, queue: m.QueueStats, engine_stats: dict, batch_threshold: int) -> m.SubserverStats:
        """The subserver's report: these totals, its queues, and the engine's KV pool and prefix cache."""
        builds, build_ms, _ = self.kernel_loads.since(self._loads_at_start)
        kv = kv_stats(engine_stats)
        kv.deferred_rows = self.kv_deferred_rows
        return m.SubserverStats(
            model=self.model,
            queue=queue,
            step=self.step_stats(batch_threshold),
            tables=self.step_tables(),
            kv=kv,
            prefix=prefix_stats(engine_stats),
            hops=m.HopStats(received=self.hops_in, delay_ms=self.hop_delay_ms),
            kernels=m.KernelLoadStats(count=builds, ms=build_ms),
        )

    def step_stats(self, batch_threshold: int) -> m.StepStats:
        return m.StepStats(
            count=self.steps,
            rows=self.rows_total,
            new_tokens=self.new_tokens_total,
            busy_ms=self.busy_ms,
            uptime_ms=(time.perf_counter() - self.started) * 1000.0,
            last_batch_size=self.last_batch_size,
            last_ms=self.last_step_ms,
            batch_threshold=batch_threshold,
            starts=dict(self.step_starts),
            gaps=self.gaps,
            gap_ms=self.gap_ms,
        )

    def step_tables(self) -> m.StepTables:
        return m.StepTables(
            by_bs=_by_bs(self.step_ms_by_bs),
            slow_by_bs={bs: (int(n), ms) for bs, (n, ms) in self.slow_ms_by_bs.items()},
            alone_by_bs=_by_bs(self.alone_ms_by_bs),
            by_shape=_by_shape_key(self.shape_ms),
            first_by_shape=_by_shape_key(self.first_shape_ms),
        )
