"""The discrete-time Markov chain of delayed batching (the paper's appendix D).

State at a batch-completion epoch, per model i: the queue `k_i` (runnable requests waiting), the running
batch `b_i` (0 = idle) and its remaining time `r_i` in ticks of δ (0 when idle). Time is discretized:
a step of b requests at model i takes `ℓ_i(b) = max(1, round(L_i(b) / δ))` ticks.

One transition = from one epoch to the next: the time to it is `τ(s) = min_{i: b_i > 0} r_i`; every model
whose batch ends then completes (simultaneous completions are handled together); each of its `b_i`
requests independently routes to model j with probability `p_ij` (multinomial), committing `c_ij` tokens;
self-transitions re-queue at i. Then every idle model whose queue holds at least `B_i` starts a batch at
once with **all** its queued requests (continuous batching: a step takes every runnable request), and the
other running batches advance by τ. The chain is enumerated from the state where all N requests are queued
at the entry model.

Throughput is a renewal-reward ratio over the stationary distribution π:
`T(B) = Σ_s π(s) Σ_{i completes at s} b_i Σ_j p_ij c_ij / Σ_s π(s) τ(s)`. The sum over i runs over the
models whose batch *ends* at the next epoch (counting every running model at every epoch counts a long
batch many times, and does not reproduce the paper's validation). See docs/tuning.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph
import scipy.sparse.linalg as spla

from tokenrouter.throughput.inputs import SystemInputs
from tokenrouter.throughput.ticks import ChainError, alone_ticks, step_ticks

DEFAULT_DELTA_MS = 0.1
DEFAULT_MAX_STATES = 250_000


@dataclass(slots=True)
class ChainResult:
    thresholds: tuple[int, ...]
    throughput: float  # committed tokens per second
    n_states: int
    utilization: tuple[float, ...]  # fraction of time each model is running a batch
    mean_batch: tuple[float, ...]  # time-average batch size while running (0 if never runs)
    mean_queue: tuple[float, ...]  # time-average number of queued (runnable, waiting) requests
    steps_per_s: tuple[float, ...]  # batches completed per second
    step_shift_ms: tuple[float, ...] = ()  # co-location: ms added to each model's step at the fixed point
    prefill_ms: tuple[float, ...] = ()  # prompt prefills: ms added to each model's step at the fixed point
    sampled_epochs: int = 0  # a sampled path's measured epochs (`large_n.py`); 0: the chain solved exactly
    stderr_tok_s: float = 0.0  # a sampled path's standard error of the throughput

    def as_dict(self, models: tuple[str, ...]) -> dict:
        shift = {
            key: dict(zip(models, value, strict=True))
            for key, value in (
                ("step_shift_ms", self.step_shift_ms),
                ("prefill_ms_per_step", self.prefill_ms),
            )
            if value
        }
        return {
            "thresholds": dict(zip(models, self.thresholds, strict=True)),
            "throughput_tok_s": self.throughput,
            "n_states": self.n_states,
            "utilization": dict(zip(models, self.utilization, strict=True)),
            "mean_batch": dict(zip(models, self.mean_batch, strict=True)),
            "mean_queue": dict(zip(models, self.mean_queue, strict=True)),
            "steps_per_s": dict(zip(models, self.steps_per_s, strict=True)),
            **shift,
            **(
                {"sampled_epochs": self.sampled_epochs, "stderr_tok_s": self.stderr_tok_s}
                if self.sampled_epochs
                else {}
            ),
        }


def delta_error(inputs: SystemInputs, delta_ms: float) -> str | None:
    """The message when δ cannot discretize these step latencies, else None: it must be a finite number of ms
    > 0 and no longer than the shortest step (a longer δ rounds that step to one tick of δ, the chain then
    runs every such step at δ and its throughput means nothing: at δ = 1e9 ms it was 0.00 tok/s)."""
    if not (isinstance(delta_ms, (int, float)) and math.isfinite(delta_ms) and delta_ms > 0):
        return f"--delta-ms must be a finite number of ms > 0, got {delta_ms}"
    ms, b, i, how = shortest_step(inputs)
    if delta_ms > ms:
        return (
            f"--delta-ms {delta_ms:g} is longer than the shortest step ({inputs.models[i]}{how} at batch size "
            f"{b}: {ms:g} ms), which would round to one tick of δ: give --delta-ms {ms:g} or less "
            f"(default {DEFAULT_DELTA_MS:g})"
        )
    return None


def shortest_step(inputs: SystemInputs) -> tuple[float, int, int, str]:
    """(ms, batch size, model index, " alone" or "") of the shortest step latency the inputs give, a latency
    alone (`AloneLatency`) included."""
    lone = [(i, a.step, " alone") for i, a in enumerate(inputs.alone or ()) if a is not None]
    return min(
        (ms, b, i, how)
        for i, s, how in [*((i, s, "") for i, s in enumerate(inputs.step)), *lone]
        for b, ms in s.points
    )


def min_states(inputs: SystemInputs) -> int:
    """A lower bound on the states of the chain at any thresholds it can run at (the entry model's B <= N):
    the first state runs all N requests as one batch at the entry model, and each way its routing row (s
    targets of non-zero probability) can split them, C(N + s - 1, s - 1), is a state of its own (the models
    are idle then, so a split is told apart by the queues and batches it leaves)."""
    s = int(np.count_nonzero(inputs.p[inputs.entry] > 0))
    return math.comb(inputs.concurrency + s - 1, s - 1) if s > 1 else 1


def too_many_states(inputs: SystemInputs, max_states: int) -> str | None:
    """The message when every chain of `inputs` has more than `max_states` states (`min_states`), else None:
    checked before any chain is built, which would take time and memory growing with N first."""
    lower = min_states(inputs)
    if lower <= max_states:
        return None
    n = inputs.concurrency
    return (
        f"at N = {n} the chain has at least {lower:.3g} states (the ways {inputs.models[inputs.entry]}'s first "
        f"batch of {n} requests can route), more than {max_states} (lower -n, or raise --max-states)"
    )


def _compositions(b: int, weights: tuple[float, ...]) -> list[tuple[tuple[int, ...], float]]:
    """Multinomial(b, weights) as (counts, probability), zero-probability targets skipped."""
    m = len(weights)
    support = [j for j in range(m) if weights[j] > 0]
    out: list[tuple[tuple[int, ...], float]] = []
    counts = [0] * m

    def rec(pos: int, left: int, logp: float) -> None:
        j = support[pos]
        if pos == len(support) - 1:
            counts[j] = left
            out.append((tuple(counts), math.exp(logp + left * math.log(weights[j]) - math.lgamma(left + 1))))
            counts[j] = 0
            return
        lw = math.log(weights[j])
        for x in range(left + 1):
            counts[j] = x
            rec(pos + 1, left - x, logp + x * lw - math.lgamma(x + 1))
        counts[j] = 0

    rec(0, b, math.lgamma(b + 1))
    return out


class _Outcomes:
    """Routing outcomes of the batches that complete together, cached by (model, batch) set."""

    def __init__(self, p: np.ndarray) -> None:
        self.rows = [tuple(float(x) for x in row) for row in p]
        self.single = lru_cache(maxsize=None)(self._single)
        self.joint = lru_cache(maxsize=None)(self._joint)

    def _single(self, i: int, b: int) -> list[tuple[tuple[int, ...], float]]:
        return _compositions(b, self.rows[i])

    def _joint(self, done: tuple[tuple[int, int], ...]) -> list[tuple[tuple[int, ...], float]]:
        dist = {(0,) * len(self.rows): 1.0}
        for i, b in done:
            nxt: dict[tuple[int, ...], float] = {}
            for add, pa in dist.items():
                for counts, pc in self.single(i, b):
                    key = tuple(x + y for x, y in zip(add, counts, strict=True))
                    nxt[key] = nxt.get(key, 0.0) + pa * pc
            dist = nxt
        return list(dist.items())


def build_chain(
    inputs: SystemInputs,
    thresholds: tuple[int, ...],
    delta_ms: float = DEFAULT_DELTA_MS,
    max_states: int = DEFAULT_MAX_STATES,
    reference: bool = False,
):
    """Enumerate the reachable states (vectorized in `chain_fast`; `reference=True`: the plain loop below). Returns (states [n, 3M] int array, transition matrix CSR,
    reward per state (expected committed tokens at the next epoch), τ per state in ticks, done mask [n, M])."""
    m, n_req = inputs.n_models, inputs.concurrency
    bvec = tuple(int(b) for b in thresholds)
    if len(bvec) != m or any(b < 1 for b in bvec):
        raise ValueError(f"expected {m} thresholds >= 1, got {thresholds!r}")
    if bvec[inputs.entry] <= n_req and (error := too_many_states(inputs, max_states)):
        raise ChainError(error)
    ticks = step_ticks(inputs, delta_ms)
    lone = alone_ticks(inputs, delta_ms)
    outcomes = _Outcomes(inputs.p)
    if not reference:
        from tokenrouter.throughput.chain_fast import build_chain_fast

        fast = build_chain_fast(inputs, bvec, ticks, outcomes, max_states, ChainError, lone)
        if fast is not None:
            return fast
    return _build_reference(inputs, bvec, ticks, lone, outcomes, max_states)


def _build_reference(
    inputs: SystemInputs, bvec: tuple[int, ...], ticks, lone, outcomes: _Outcomes, max_states
):
    """`build_chain`'s plain loop: breadth-first from the start state, one state at a time."""
    m = inputs.n_models
    tps = inputs.tokens_per_step()
    s0 = _initial_state(inputs, bvec, ticks, lone)
    index = {s0: 0}
    states = [s0]
    # the transition matrix's entries: (rows, cols, values)
    entries: tuple[list[int], list[int], list[float]] = ([], [], [])
    rows, cols, vals = entries
    reward: list[float] = []
    tau: list[int] = []
    done_rows: list[tuple[int, ...]] = []
    for q, s in enumerate(states):  # (states grows as the loop finds them)
        k, b, r = (list(s[j::3]) for j in range(3))
        t, done, nb, nr = _next_epoch(inputs, bvec, k, b, r)
        tau.append(t)
        reward.append(sum(bi * tps[i] for i, bi in done))
        done_rows.append(tuple(int(any(i == d for d, _ in done)) for i in range(m)))
        for add, prob in outcomes.joint(done):
            ns = _start(inputs, bvec, ticks, lone, [k[j] + add[j] for j in range(m)], nb.copy(), nr.copy())
            rows.append(q)
            cols.append(_number(ns, index, states, max_states))
            vals.append(prob)
    return _as_arrays(states, entries, reward, tau, done_rows)


def _initial_state(inputs: SystemInputs, bvec: tuple[int, ...], ticks, lone) -> tuple[int, ...]:
    """The start state: every request at the entry model, nothing batched."""
    m = inputs.n_models
    k0 = [0] * m
    k0[inputs.entry] = inputs.concurrency
    return _start(inputs, bvec, ticks, lone, k0, [0] * m, [0] * m)


def _as_arrays(states: list, entries: tuple[list, list, list], reward: list, tau: list, done_rows: list):
    """The chain built by `_build_reference` as arrays: states, the sparse transition matrix (from its
    (rows, cols, values) entries), rewards, epoch lengths and which models finished in each state."""
    rows, cols, vals = entries
    n = len(states)
    mat = sp.csr_matrix((np.array(vals), (np.array(rows), np.array(cols))), shape=(n, n))
    return (
        np.array(states, dtype=np.int64),
        mat,
        np.array(reward),
        np.array(tau, dtype=float),
        np.array(done_rows, dtype=bool),
    )


def _number(s: tuple[int, ...], index: dict, states: list, max_states: int) -> int:
    """State s's index, numbering it next where it is new (refused past `max_states` states)."""
    col = index.get(s)
    if col is None:
        col = index[s] = len(states)
        states.append(s)
        if len(states) > max_states:
            raise ChainError(
                f"the chain has more than {max_states} states (raise --max-states, or try a coarser --delta-ms)"
            )
    return col


def _start(
    inputs: SystemInputs, bvec, ticks, lone, k: list[int], b: list[int], r: list[int]
) -> tuple[int, ...]:
    """The state with every idle model whose queue reaches its threshold started on its queue."""
    m = inputs.n_models
    new = [i for i in range(m) if b[i] == 0 and k[i] >= bvec[i] and k[i] > 0]
    for i in new:
        b[i], k[i] = k[i], 0
    running = [x > 0 for x in b]  # with the steps starting now: they run beside each other
    for i in new:
        r[i] = (lone[i] if inputs.step_alone(i, running) else ticks[i])[b[i]]
    return tuple(x for i in range(m) for x in (k[i], b[i], r[i]))


def _next_epoch(inputs: SystemInputs, bvec, k: list[int], b: list[int], r: list[int]):
    """The state's next epoch: τ ticks, the (model, batch) that complete then, and the batches and ticks left."""
    m = inputs.n_models
    active = [i for i in range(m) if b[i] > 0]
    if not active:
        raise ChainError(
            "delayed batching deadlocks: every model is idle and no queue reaches its threshold "
            f"(queues {dict(zip(inputs.models, k, strict=True))}, thresholds {dict(zip(inputs.models, bvec, strict=True))})"
        )
    t = min(r[i] for i in active)
    done = tuple((i, b[i]) for i in active if r[i] == t)
    nb = [0 if r[i] == t else b[i] for i in range(m)]
    nr = [r[i] - t if nb[i] else 0 for i in range(m)]
    return t, done, nb, nr


def _stationary_irreducible(
    mat: sp.csr_matrix, direct_limit: int = 4000, tol: float = 1e-12, max_iter: int = 2000
) -> np.ndarray:
    """π of an irreducible chain. Small chains: fix π_0 = 1 and solve the other balance equations by
    sparse LU. Large ones (LU fill-in grows fast): Gauss-Seidel on π (I − P) = 0 — split I − Pᵀ = (D − L) − U
    and solve (D − L) x' = U x, a sparse triangular solve per sweep, normalizing x' — until the residual
    ‖xP − x‖₁ is < `tol` (x summing to 1); LU if it does not get there in `max_iter` sweeps. The triangular
    factor is set up for SuperLU once (natural order, no pivoting: the factorization of a triangular matrix is
    itself), so a sweep is one triangular solve, not `spsolve_triangular`'s per-call rebuild of the matrix."""
    n = mat.shape[0]
    if n == 1:
        return np.ones(1)
    if n > direct_limit:
        a = (sp.identity(n, format="csr") - mat.T).tocsr()
        lower = spla.splu(sp.tril(a, format="csc"), permc_spec="NATURAL", diag_pivot_thresh=0.0,
                          options={"SymmetricMode": True})  # fmt: skip
        upper = -sp.triu(a, k=1, format="csr")
        pt = mat.T.tocsr()
        x = np.full(n, 1.0 / n)
        for it in range(max_iter):
            x = lower.solve(upper @ x)
            x /= x.sum()
            if it % 5 == 4 and np.abs(pt @ x - x).sum() < tol:
                x = np.clip(x, 0.0, None)
                return x / x.sum()
    a = (sp.identity(n, format="csr") - mat).T.tocsc()
    rhs = -a[1:, 0].toarray().ravel()
    x = spla.splu(a[1:, 1:].tocsc(), permc_spec="MMD_AT_PLUS_A").solve(rhs)
    pi = np.clip(np.concatenate([[1.0], x]), 0.0, None)
    return pi / pi.sum()


def stationary(mat: sp.csr_matrix, start: int = 0) -> np.ndarray:
    """The long-run (Cesàro) state distribution from `start`: the stationary distribution of the closed
    class the chain ends in, weighted by the probability of ending there when there are several."""
    n = mat.shape[0]
    n_cls, labels = csgraph.connected_components(mat, directed=True, connection="strong")
    coo = mat.tocoo()
    leaving = labels[coo.row] != labels[coo.col]
    open_cls = np.zeros(n_cls, dtype=bool)
    open_cls[labels[coo.row[leaving]]] = True
    closed = [c for c in range(n_cls) if not open_cls[c]]
    pi = np.zeros(n)
    if len(closed) == 1:
        idx = np.flatnonzero(labels == closed[0])
        pi[idx] = _stationary_irreducible(mat[idx][:, idx].tocsr())
        return pi
    # Several closed classes: absorption probabilities from `start` over the transient states.
    recurrent = np.isin(labels, closed)
    trans = np.flatnonzero(~recurrent)
    weight = {}
    for c in closed:
        idx = np.flatnonzero(labels == c)
        if recurrent[start]:
            weight[c] = 1.0 if labels[start] == c else 0.0
        else:
            q = mat[trans][:, trans]
            rvec = np.asarray(mat[trans][:, idx].sum(axis=1)).ravel()
            h = spla.spsolve((sp.identity(len(trans)) - q).tocsc(), rvec)
            weight[c] = float(np.atleast_1d(h)[np.searchsorted(trans, start)])
        if weight[c] > 0:
            pi[idx] = weight[c] * _stationary_irreducible(mat[idx][:, idx].tocsr())
    return pi / pi.sum()


def analyze(
    inputs: SystemInputs,
    thresholds: tuple[int, ...],
    delta_ms: float = DEFAULT_DELTA_MS,
    max_states: int = DEFAULT_MAX_STATES,
) -> ChainResult:
    """Long-run throughput and per-model statistics of delayed batching with thresholds B (at the fixed point
    of the inputs' co-location terms where they have any: `colocation.py`; and of their prefill costs:
    `prefill.py`)."""
    from tokenrouter.throughput.prefill import has_prefill, solve

    if has_prefill(inputs):
        return solve(inputs, tuple(thresholds), _analyze_shared, delta_ms, max_states)
    return _analyze_shared(inputs, thresholds, delta_ms, max_states)


def with_transit(inputs: SystemInputs, result: ChainResult, hop_ms) -> float:
    """The chain's throughput with each hop into model j taking `hop_ms[j]` ms in transit, estimated as a delay
    station beside the models: X' = N / (N / X + Z), Z the transit time per committed token (the hops into each
    model per second, from the chain's steps and batch sizes, times its delay, over X). It holds the models'
    response time fixed while a request is away; on served H200 rows it came within sd 0.021 (0.949 to 1.047) of the
    simulator's closed loop with the measured delays over the one with instant hops. Hops per token do not depend on B, so it scales every candidate alike."""
    x, n, m = result.throughput, inputs.concurrency, inputs.n_models
    if not x > 0:
        return x
    rows = [s * b for s, b in zip(result.steps_per_s, result.mean_batch, strict=True)]
    hops_in = [sum(rows[i] * inputs.p[i, j] for i in range(m) if i != j) for j in range(m)]
    z = sum(h * d / 1000.0 for h, d in zip(hops_in, hop_ms, strict=True)) / x
    return n / (n / x + z)


def _analyze_shared(
    inputs: SystemInputs, thresholds: tuple[int, ...], delta_ms: float, max_states: int
) -> ChainResult:
    """The chain at the fixed point of the co-location terms, or the plain chain where there are none."""
    if any(t is not None for t in inputs.colocation):
        from tokenrouter.throughput.colocation import solve

        return solve(inputs, tuple(thresholds), _analyze_plain, delta_ms, max_states)
    return _analyze_plain(inputs, thresholds, delta_ms, max_states)


def _analyze_plain(
    inputs: SystemInputs, thresholds: tuple[int, ...], delta_ms: float, max_states: int
) -> ChainResult:
    states, mat, reward, tau, done = build_chain(inputs, tuple(thresholds), delta_ms, max_states)
    pi = stationary(mat)
    m = inputs.n_models
    wt = pi * tau  # time weight of each state (ticks)
    total_time = float(wt.sum())  # ticks per epoch
    k = states[:, 0::3]
    b = states[:, 1::3]
    busy = (b > 0).astype(float)
    util = wt @ busy / total_time
    busy_time = wt @ busy
    mean_batch = np.divide(wt @ b, busy_time, out=np.zeros(m), where=busy_time > 0)
    mean_queue = wt @ k / total_time
    per_s = 1000.0 / (total_time * delta_ms)
    return ChainResult(
        thresholds=tuple(int(x) for x in thresholds),
        throughput=float(pi @ reward) * per_s,
        n_states=int(states.shape[0]),
        utilization=tuple(float(x) for x in util),
        mean_batch=tuple(float(x) for x in mean_batch),
        mean_queue=tuple(float(x) for x in mean_queue),
        steps_per_s=tuple(float(x) for x in (pi @ done.astype(float)) * per_s),
    )
