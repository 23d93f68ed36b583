"""The tuner where the chain is too large to enumerate: the same chain, sampled.

The exact chain (`dtmc.py`) has a state per reachable (queue, batch, remaining ticks) of every model; at N = 128
with two models, or N = 32 with three, a single candidate's chain has more than the 250,000-state cap and the
feasible candidates number thousands. Here every candidate's chain is not enumerated but *run*: one sample path
per candidate, all candidates at once in numpy arrays (one array row per candidate), epoch by epoch with the
chain's own rules — the same ticks `ℓ_i(b)` (latencies alone included), the same simultaneous completions, the
same start rule, each completed batch routed by a multinomial draw. A path's long-run
averages are the chain's stationary ones (T(B) as the renewal-reward ratio, with the expected tokens of each
completed batch as its reward, as the chain has it), so the only difference from the exact chain is the sampling
error, which the path's length bounds and the result reports (a batch-means standard error).

The search races the candidates (successive halving): every one runs a short path, and after each round of
`ROUND_EPOCHS` more those behind the best by more than `Z` joint standard errors are dropped, and at most half go
on, until `FINALISTS` are left. Where the feasible candidates are more than `POOL_LIMIT`, the race runs over a
ladder of thresholds per model (1, 2, 3, 4, 6, 8, 12, … up to N) and then zooms: the next race is over the box
between the ladder neighbours of the winner, until the box is every integer. The candidates of every level within
reach of the best race once more, from fresh paths, and the finalists' T is measured over `FINAL_EPOCHS` of their
own: B* is the best of them. Co-location terms and prompt prefills, fixed points over the chain's result, are
solved for the finalists only (`colocation.solve`, `prefill.solve` with one path per solve); the race before them
prices steps without them.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping

import numpy as np

from tokenrouter.throughput.dtmc import ChainError, ChainResult, alone_ticks, build_chain, step_ticks
from tokenrouter.throughput.inputs import SystemInputs
from tokenrouter.throughput.tune_result import TuneResult, count_feasible, feasible

METHOD = "sampled"
EXACT_STATES = 50_000  # the exact chain where the probe's has at most this many states (`chain_fits`)
EXACT_WORK = 400_000  # ... and those states times the feasible candidates are at most this many
POOL_LIMIT = 256  # feasible candidates raced at once; more: a ladder per model, then zoom
LEVEL_POOL = 128  # candidates of a zoom level at most (the axis points per free model follow from it)
WARMUP_EPOCHS = 200  # epochs run and not measured (a path starts with every request at the entry)
ROUND_EPOCHS = 300  # measured epochs each round of the race adds to every candidate still in it
FINAL_EPOCHS = 4_000  # measured epochs each finalist runs last
FINAL_POOL = 32  # candidates of the last race at most (`_within_reach`)
FINALISTS = 4  # the race stops when at most this many are left
Z = 3.0  # a candidate is dropped when its T is behind the best's by more than Z of their joint standard error
_CHUNK = 100  # epochs per batch of the batch-means standard error
_BIG = np.iinfo(np.int64).max


class _Paths:
    """One sample path of the chain per candidate (a row of each array), advanced together epoch by epoch."""

    def __init__(self, inputs: SystemInputs, cands: np.ndarray, delta_ms: float, seed: int) -> None:
        m, n = inputs.n_models, inputs.concurrency
        self.inputs, self.delta_ms, self.m = inputs, delta_ms, m
        self.b = np.asarray(cands, dtype=np.int64).reshape(-1, m)
        self.ticks = np.array(step_ticks(inputs, delta_ms), dtype=np.int64)  # [M, N+1]
        lone = alone_ticks(inputs, delta_ms)
        self.lone = np.array([t if a is None else a for t, a in zip(self.ticks.tolist(), lone, strict=True)],
                             dtype=np.int64)  # fmt: skip
        self.co = np.zeros((m, m), dtype=np.int64)  # co[j, i]: j is a co-runner of i (a latency alone)
        for i, a in enumerate(inputs.alone or ()):
            if a is not None:
                self.co[list(a.co_runners), i] = 1
        self.has_alone = self.co.any(axis=0)[None, :]
        self.cols = np.arange(m)[None, :]
        self.tps = inputs.tokens_per_step()
        self.p = np.array(inputs.p, dtype=float)  # [M, M]: each completed batch routes by its model's row
        self.rng = np.random.default_rng(seed)
        c = len(self.b)
        self.kb = np.zeros((c, 2 * m), dtype=np.int64)  # queues | running batches (0: idle)
        self.kb[:, inputs.entry] = n
        self.r = np.zeros((c, m), dtype=np.int64)  # remaining ticks of the running batches
        self._start()
        self.reset()

    def reset(self) -> None:
        """Forget what was measured (after the warm-up)."""
        c, m = len(self.b), self.m
        self.acc_kb = np.zeros((c, 2 * m))  # ticks × (queue | batch)
        self.acc_busy = np.zeros((c, m))  # ticks running
        self.acc_steps = np.zeros((c, m))  # steps completed
        self.chunks: list[tuple[np.ndarray, np.ndarray]] = []  # per batch of epochs: (tokens, ticks) [C] each
        self.epochs = 0

    def keep(self, rows: np.ndarray) -> None:
        """Only these candidates go on."""
        for name in ("b", "kb", "r", "acc_kb", "acc_busy", "acc_steps"):
            setattr(self, name, getattr(self, name)[rows])
        self.chunks = [(tok[rows], tk[rows]) for tok, tk in self.chunks]

    def _start(self) -> None:
        """Every idle model whose queue holds at least its threshold starts a step with all of it (`dtmc`)."""
        m = self.m
        k, run = self.kb[:, :m], self.kb[:, m:]
        go = (run == 0) & (k >= self.b)
        if not go.any():
            return
        nb = np.where(go, k, run)
        ticks = self.ticks[self.cols, k]
        if self.has_alone.any():  # alone: no co-runner running, the steps starting now included
            alone = self.has_alone & (((nb > 0).astype(np.int64) @ self.co) == 0)
            ticks = np.where(alone, self.lone[self.cols, k], ticks)
        self.r = np.where(go, ticks, self.r)
        self.kb[:, m:] = nb
        self.kb[:, :m] = np.where(go, 0, k)

    def advance(self, epochs: int, measure: bool = True) -> None:
        m = self.m
        c = len(self.b)
        tok, tk = np.zeros(c), np.zeros(c, dtype=np.int64)
        for e in range(epochs):
            run = self.kb[:, m:]
            running = run > 0
            rr = np.where(running, self.r, _BIG)
            t = rr.min(axis=1)
            if t.max() == _BIG:
                row = int(np.argmax(t))
                raise ChainError(
                    "delayed batching deadlocks: every model is idle and no queue reaches its threshold "
                    f"(thresholds {dict(zip(self.inputs.models, self.b[row].tolist(), strict=True))})"
                )
            done = rr == t[:, None]
            ended = np.where(done, run, 0)
            if measure:
                w = t[:, None]
                self.acc_kb += self.kb * w
                self.acc_busy += running * w
                self.acc_steps += done
                tok += ended @ self.tps
                tk += t
                self.epochs += 1
                if self.epochs % _CHUNK == 0 or e + 1 == epochs:
                    self.chunks.append((tok, tk))
                    tok, tk = np.zeros(c), np.zeros(c, dtype=np.int64)
            self.r = np.where(running & ~done, self.r - t[:, None], 0)
            self.kb[:, m:] = run - ended
            if ended.any():  # every completed batch's multinomial at once: [C, from, to], summed over from
                self.kb[:, :m] += self.rng.multinomial(ended, self.p).sum(axis=1)
            self._start()

    def estimate(self) -> tuple[np.ndarray, np.ndarray]:
        """T in tokens per tick and its batch-means standard error (inf from fewer than two batches)."""
        tok = np.array([x for x, _ in self.chunks])  # [K, C]
        tk = np.array([x for _, x in self.chunks], dtype=float)
        t = tok.sum(axis=0) / tk.sum(axis=0)
        k = len(self.chunks)
        if k < 2:
            return t, np.full_like(t, np.inf)
        resid = tok - t[None, :] * tk
        return t, np.sqrt((resid**2).sum(axis=0) / (k * (k - 1))) / tk.mean(axis=0)

    def results(self) -> list[ChainResult]:
        """Each candidate's measurement as the chain reports it (`n_states` 0: a sampled path)."""
        t, se = self.estimate()
        ticks = sum(x for _, x in self.chunks).astype(float)
        per_s = 1000.0 / self.delta_ms  # ticks per second
        out = []
        for row in range(len(self.b)):
            total, busy = ticks[row], self.acc_busy[row]
            batch = np.divide(self.acc_kb[row, self.m :], busy, out=np.zeros(self.m), where=busy > 0)
            out.append(
                ChainResult(
                    thresholds=tuple(int(x) for x in self.b[row]),
                    throughput=float(t[row] * per_s),
                    n_states=0,
                    utilization=tuple(float(x) for x in busy / total),
                    mean_batch=tuple(float(x) for x in batch),
                    mean_queue=tuple(float(x) for x in self.acc_kb[row, : self.m] / total),
                    steps_per_s=tuple(float(x) for x in self.acc_steps[row] / total * per_s),
                    sampled_epochs=self.epochs,
                    stderr_tok_s=float(se[row] * per_s),
                )
            )
        return out


def race(inputs: SystemInputs, cands: list[tuple[int, ...]], delta_ms: float, seed: int = 0,
         final_epochs: int = FINAL_EPOCHS) -> tuple[list[ChainResult], list[ChainResult]]:  # fmt: skip
    """Race the candidates (module docstring): (the finalists after `final_epochs` more, best first; the
    others as last measured, the last dropped first). `final_epochs` 0: the finalists as the race left them."""
    paths = _Paths(inputs, np.array(cands), delta_ms, seed)
    paths.advance(WARMUP_EPOCHS, measure=False)
    paths.reset()
    dropped: list[ChainResult] = []
    while True:
        paths.advance(ROUND_EPOCHS)
        if len(paths.b) <= FINALISTS:
            break
        t, se = paths.estimate()
        best = int(np.argmax(t))
        close = t + Z * np.sqrt(se**2 + se[best] ** 2) >= t[best]
        order = np.argsort(-t, kind="stable")
        rows = np.sort([x for x in order[: max(FINALISTS, (len(order) + 1) // 2)] if close[x]])
        gone = np.setdiff1d(np.arange(len(paths.b)), rows)
        everyone = paths.results()
        dropped = sorted((everyone[x] for x in gone), key=lambda r: -r.throughput) + dropped
        paths.keep(rows)
    if final_epochs:  # measured afresh: the rounds' epochs chose the finalists, and would flatter them
        paths.reset()
        paths.advance(final_epochs)
    finalists = sorted(paths.results(), key=lambda r: -r.throughput)
    return finalists, dropped


def chain_fits(inputs: SystemInputs, fixed: Mapping[int, int], delta_ms: float, n_feasible: int) -> bool:
    """Whether the exact search is worth its cost: the chain of the probe candidate — every free threshold 1,
    the fixed ones as given, usually the largest chain of the search — has at most `EXACT_STATES` states (its
    enumeration stops as soon as it has more), and those states times the `n_feasible` candidates are at most
    `EXACT_WORK` (two models at N = 16 would solve 136 chains of up to 18,000 states, twice or three times each
    for the prefill fixed point: some 40 s, against 5 s sampled). (`--max-states` caps each chain of the exact
    search, as before.)"""
    probe = tuple(fixed.get(i, 1) for i in range(inputs.n_models))
    try:
        states = build_chain(inputs, probe, delta_ms, EXACT_STATES)[0]
    except ChainError as e:
        return "deadlock" in str(e)  # the exact search reports it as it does
    return len(states) * n_feasible <= EXACT_WORK


def ladder(n: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, … (powers of two and 1.5 times them) up to n."""
    out, x = [1], 2
    while x <= n:
        out += [v for v in (x, x * 3 // 2) if v <= n]
        x *= 2
    return out


def _spread(lo: int, hi: int, k: int, keep: int) -> list[int]:
    """Every integer of [lo, hi] where they are at most k, else k of them evenly spaced (and `keep`)."""
    if hi - lo + 1 <= k:
        return list(range(lo, hi + 1))
    return sorted({*(int(round(x)) for x in np.linspace(lo, hi, k)), keep})


def _zoom(axis: list[int], w: int, k: int) -> list[int]:
    """The next level's points of one model: from the ladder neighbour below the winner `w` to the one above."""
    pos = axis.index(w)
    return _spread(axis[max(pos - 1, 0)], axis[min(pos + 1, len(axis) - 1)], k, w)


def _within_reach(results: list[ChainResult]) -> list[tuple[int, ...]]:
    """The candidates of every level whose last T is within `Z` joint standard errors of the best one's (at
    most `FINAL_POOL`, the best first): they race again, from fresh paths, to the final runs."""
    best = max(results, key=lambda r: r.throughput)
    close = [r for r in results
             if r.throughput + Z * math.hypot(r.stderr_tok_s, best.stderr_tok_s) >= best.throughput]  # fmt: skip
    return [r.thresholds for r in sorted(close, key=lambda r: -r.throughput)[:FINAL_POOL]]


def sampled_analyze(
    inputs: SystemInputs, thresholds: tuple[int, ...], delta_ms: float, seed: int = 0
) -> ChainResult:
    """One candidate's sampled path (warm-up, a round, the final run), at the fixed point of the inputs' co-location
    terms and prefill costs as `dtmc.analyze` solves them (each solve one path, from the same seed)."""
    from tokenrouter.throughput.colocation import solve as colocated
    from tokenrouter.throughput.prefill import has_prefill
    from tokenrouter.throughput.prefill import solve as prefilled

    def plain(inp: SystemInputs, b: tuple[int, ...], d: float, _max_states: int) -> ChainResult:
        return race(inp, [tuple(b)], d, seed)[0][0]

    def shared(inp: SystemInputs, b: tuple[int, ...], d: float, max_states: int) -> ChainResult:
        if any(t is not None for t in inp.colocation):
            return colocated(inp, b, plain, d, max_states)
        return plain(inp, b, d, max_states)

    b = tuple(thresholds)
    return (
        prefilled(inputs, b, shared, delta_ms, 0) if has_prefill(inputs) else shared(inputs, b, delta_ms, 0)
    )


def tune_sampled(inputs: SystemInputs, fixed: Mapping[int, int], delta_ms: float, seed: int = 0):
    """B* by racing sampled paths of the chain (module docstring); a `TuneResult` whose method is `METHOD`, its
    results in the last race's order (the finalists best first, from their final runs; then the others, the
    last dropped first), then the candidates that did not reach it, by their T."""
    t0 = time.perf_counter()
    n, n_free = inputs.concurrency, inputs.n_models - len(fixed)
    n_feasible = count_feasible(n_free, n - sum(v - 1 for v in fixed.values()))
    seen, levels = _zoom_in(inputs, fixed, n_feasible, n_free, delta_ms, seed)
    final_pool = _within_reach(list(seen.values()))
    finalists, dropped = race(inputs, final_pool, delta_ms, seed + levels)
    finalists = _rerun_finalists(inputs, finalists, delta_ms, seed)
    ranked = finalists + dropped  # the last race's, in its order
    raced = set(final_pool)
    rest = sorted((r for b, r in seen.items() if b not in raced), key=lambda r: -r.throughput)
    return TuneResult(
        models=inputs.models,
        concurrency=n,
        delta_ms=delta_ms,
        fixed={inputs.models[i]: v for i, v in sorted(fixed.items())},
        method=METHOD,
        n_feasible=n_feasible,
        results=ranked + rest,
        seconds=time.perf_counter() - t0,
        sampling=_sampling_record(levels, len(final_pool), len(finalists), seed),
    )


def _rerun_finalists(inputs: SystemInputs, finalists: list, delta_ms: float, seed: int) -> list:
    """With co-location terms or prefill costs: the finalists analyzed again with them, best first."""
    if any(t is not None for t in inputs.colocation) or any(c is not None for c in inputs.prefill):
        finalists = sorted((sampled_analyze(inputs, r.thresholds, delta_ms, seed) for r in finalists),
                           key=lambda r: -r.throughput)  # fmt: skip
    return finalists


def _sampling_record(levels: int, final_race: int, finalists: int, seed: int) -> dict:
    """How the sampled search ran, as a `TuneResult` records it."""
    return {
        "levels": levels,
        "final_race": final_race,
        "warmup_epochs": WARMUP_EPOCHS,
        "round_epochs": ROUND_EPOCHS,
        "final_epochs": FINAL_EPOCHS,
        "finalists": finalists,
        "z": Z,
        "seed": seed,
    }


def _zoom_in(
    inputs: SystemInputs, fixed: Mapping[int, int], n_feasible: int, n_free: int, delta_ms: float, seed: int
):
    """The races over levels of candidates, each level's grid zoomed in around the last one's winner until it
    is every threshold of its span: every candidate raced, by its thresholds, and the count of levels."""
    n, m = inputs.concurrency, inputs.n_models
    per_axis = max(5, round(LEVEL_POOL ** (1 / max(n_free, 1))))
    whole = n_feasible <= POOL_LIMIT
    axes = [[fixed[i]] if i in fixed else list(range(1, n + 1)) if whole else ladder(n) for i in range(m)]
    seen: dict[tuple[int, ...], ChainResult] = {}
    level = 0
    while True:
        cands = [b for b in itertools.product(*axes) if feasible(b, n)]
        finalists, dropped = race(inputs, cands, delta_ms, seed + level, final_epochs=0)
        seen.update({r.thresholds: r for r in dropped + finalists})
        if all(len(a) == a[-1] - a[0] + 1 for a in axes):
            return seen, level + 1
        zoomed = [_zoom(a, w, per_axis) for a, w in zip(axes, finalists[0].thresholds, strict=True)]
        axes = zoomed if zoomed != axes else [list(range(a[0], a[-1] + 1)) for a in axes]
        level += 1


def describe(result) -> str:
    """The line `tune` prints about a sampled search."""
    s, best = result.sampling, result.best
    return (
        f"sampled chain (the exact chains are too many or too large): {len(result.results)} candidates raced over {s['levels']} "
        f"level{'s' if s['levels'] > 1 else ''}, the {s['final_race']} nearest the best again, the "
        f"{s['finalists']} finalists over {best.sampled_epochs} epochs each; B*'s T ± {best.stderr_tok_s:.2f} tok/s "
        '(one standard error; docs/tuning.md, "Large N")'
    )
