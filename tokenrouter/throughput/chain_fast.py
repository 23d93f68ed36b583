"""A vectorized enumeration of the same chain as `dtmc.build_chain` (same states, same transitions).

Breadth-first by levels with numpy: every state of the frontier is processed at once. States are encoded
as one int64 in mixed radix (k_i, b_i ∈ 0..N, r_i ∈ 0..max ticks); states whose batches complete with the
same sizes share one routing-outcome table; the tables are concatenated once per chain and every row of a level is
expanded by its own table in one gather (no per-group loop). `dtmc.build_chain` is the
plain reference; a test checks that both give the same chain.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from tokenrouter.throughput.inputs import SystemInputs

_INT64_LIMIT = 2**62


class _Codec:
    def __init__(self, m: int, n: int, max_ticks: list[int]) -> None:
        radix = []
        for i in range(m):
            radix += [n + 1, n + 1, max_ticks[i] + 1]
        total = 1
        for r in radix:
            total *= r
        self.ok = total < _INT64_LIMIT
        self.radix = np.array(radix, dtype=np.int64)
        self.mult = np.ones(len(radix), dtype=np.int64)
        for j in range(len(radix) - 2, -1, -1):
            self.mult[j] = self.mult[j + 1] * radix[j + 1]

    def encode(self, s: np.ndarray) -> np.ndarray:
        return s @ self.mult

    def decode(self, keys: np.ndarray) -> np.ndarray:
        return (keys[:, None] // self.mult[None, :]) % self.radix[None, :]


def build_chain_fast(inputs: SystemInputs, thresholds: tuple[int, ...], ticks: list[list[int]], outcomes,
                     max_states: int, error_cls: type[Exception], alone: list | None = None):  # fmt: skip
    """Same contract as `dtmc.build_chain` (minus argument checks); returns None when the state encoding
    would not fit in int64 (the caller falls back to the reference). `alone`: per model its ticks while no
    co-runner runs (`dtmc.alone_ticks`), or None."""
    m, n = inputs.n_models, inputs.concurrency
    alone = alone or [None] * m
    lone_tab = np.array([t if a is None else a for t, a in zip(ticks, alone, strict=True)], dtype=np.int64)
    codec = _Codec(m, n, [max(max(t[1:]), max(a[1:])) for t, a in zip(ticks, lone_tab.tolist(), strict=True)])
    if not codec.ok:
        return None
    return _Levels(inputs, thresholds, ticks, lone_tab, codec, outcomes, error_cls).build(max_states)


class _Levels:
    """The chain enumerated level by level: each level's states (the frontier) advance to their next epoch
    together, expand by their routing outcomes, and the successors not seen before are the next level."""

    def __init__(self, inputs: SystemInputs, thresholds, ticks, lone_tab, codec: _Codec, outcomes, error_cls):
        m = self.m = inputs.n_models
        self.n, self.inputs, self.thresholds = inputs.concurrency, inputs, thresholds
        self.codec, self.outcomes, self.error_cls = codec, outcomes, error_cls
        self.bvec = np.array(thresholds, dtype=np.int64)
        self.tick_tab, self.lone_tab = np.array(ticks, dtype=np.int64), lone_tab  # [M, N+1]
        # co[j, i]: model j is a co-runner of model i (for the models with a latency alone)
        self.co = np.zeros((m, m), dtype=np.int64)
        for i, a in enumerate(inputs.alone or ()):
            if a is not None:
                self.co[list(a.co_runners), i] = 1
        self.has_alone = self.co.any(axis=0)
        self.tps = inputs.tokens_per_step()
        self.cols_k = np.arange(m) * 3
        self.cols_b, self.cols_r = self.cols_k + 1, self.cols_k + 2
        # routing-outcome tables by completion signature (the completed batch size of each model), concatenated
        self.sig_radix = np.int64(self.n + 1) ** np.arange(m, dtype=np.int64)
        self.table_at: dict[int, tuple[int, int]] = {}
        self.adds_l: list[tuple[int, ...]] = []
        self.probs_l: list[float] = []
        self.all_adds = self.all_probs = None

    def start(self, s: np.ndarray) -> np.ndarray:
        """States `s` with every idle model whose queue reaches its threshold started on its queue (in place)."""
        m, n, cols_k, cols_b = self.m, self.n, self.cols_k, self.cols_b
        k, b = s[:, cols_k], s[:, cols_b]
        go = (b == 0) & (k >= self.bvec) & (k > 0)
        if go.any():
            ticks_now = self.tick_tab[np.arange(m)[None, :], np.minimum(k, n)]
            nb = np.where(go, k, b)
            if self.has_alone.any():  # alone: no co-runner running, the steps starting now included
                lone = self.has_alone[None, :] & (((nb > 0).astype(np.int64) @ self.co) == 0)
                ticks_now = np.where(lone, self.lone_tab[np.arange(m)[None, :], np.minimum(k, n)], ticks_now)
            s[:, cols_b] = nb
            s[:, self.cols_r] = np.where(go, ticks_now, s[:, self.cols_r])
            s[:, cols_k] = np.where(go, 0, k)
        return s

    def build(self, max_states: int):
        s0 = np.zeros((1, 3 * self.m), dtype=np.int64)
        s0[0, 3 * self.inputs.entry] = self.n
        s0 = self.start(s0)
        index = {int(self.codec.encode(s0)[0]): 0}
        state_chunks = [s0]
        frontier, frontier_idx = s0, np.array([0])
        parts: dict[str, list] = {k: [] for k in ("rows", "cols", "vals", "reward", "tau", "done", "order")}
        while len(frontier):
            nb, nr, sig = self._epoch(frontier, frontier_idx, parts)
            keys, src, probs = self._successors(frontier, frontier_idx, nb, nr, sig)
            uniq, kinv = np.unique(keys, return_inverse=True)
            ids = np.fromiter((index.get(x, -1) for x in uniq.tolist()), dtype=np.int64, count=len(uniq))
            fresh = np.flatnonzero(ids < 0)
            ids[fresh] = np.arange(len(index), len(index) + len(fresh))
            for x, i in zip(uniq[fresh].tolist(), ids[fresh].tolist(), strict=True):
                index[x] = i
            if len(index) > max_states:
                raise self.error_cls(
                    f"the chain has more than {max_states} states (raise --max-states, or try a coarser --delta-ms)"
                )
            parts["rows"].append(src)
            parts["cols"].append(ids[kinv])
            parts["vals"].append(probs)
            frontier, frontier_idx = self.codec.decode(uniq[fresh]), ids[fresh]
            state_chunks.append(frontier)
        return self._assemble(len(index), state_chunks, parts)

    def _epoch(self, frontier: np.ndarray, frontier_idx: np.ndarray, parts: dict[str, list]):
        """Each state's next epoch: the batches that complete first, after τ ticks, and the tokens they commit
        (into `parts`); returns the batches and ticks left after it and each state's completion signature."""
        b, r = frontier[:, self.cols_b], frontier[:, self.cols_r]
        active = b > 0
        dead = ~active.any(axis=1)
        if dead.any():
            d = frontier[np.flatnonzero(dead)[0]]
            raise self.error_cls(
                "delayed batching deadlocks: every model is idle and no queue reaches its threshold "
                f"(queues {dict(zip(self.inputs.models, d[self.cols_k].tolist(), strict=True))}, "
                f"thresholds {dict(zip(self.inputs.models, self.thresholds, strict=True))})"
            )
        t = np.where(active, r, np.iinfo(np.int64).max).min(axis=1)
        done = active & (r == t[:, None])
        parts["reward"].append((np.where(done, b, 0) * self.tps[None, :]).sum(axis=1))
        parts["tau"].append(t)
        parts["done"].append(done)
        parts["order"].append(frontier_idx)
        nb = np.where(done, 0, b)
        nr = np.where(nb > 0, r - t[:, None], 0)
        return nb, nr, np.where(done, b, 0)

    def _outcome_tables(self, sig: np.ndarray):
        """Each row's routing-outcome table (its offset and length among all tables) by its completion
        signature, the tables of signatures not seen before added."""
        sig_key = sig @ self.sig_radix
        uniq_sig, first_row, inv = np.unique(sig_key, return_index=True, return_inverse=True)
        for key, row in zip(uniq_sig.tolist(), first_row.tolist(), strict=True):
            if key not in self.table_at:
                done_set = tuple((i, int(sig[row, i])) for i in range(self.m) if sig[row, i] > 0)
                table = self.outcomes.joint(done_set)
                self.table_at[key] = (len(self.probs_l), len(table))
                self.adds_l.extend(a for a, _ in table)
                self.probs_l.extend(p for _, p in table)
                self.all_adds, self.all_probs = None, None
        if self.all_adds is None:
            self.all_adds = np.array(self.adds_l, dtype=np.int64).reshape(-1, self.m)
            self.all_probs = np.array(self.probs_l)
        off_c = np.array([self.table_at[x] for x in uniq_sig.tolist()], dtype=np.int64).reshape(-1, 2)
        return off_c[inv, 0], off_c[inv, 1]

    def _successors(self, frontier, frontier_idx, nb, nr, sig):
        """Every row of the frontier expanded by its outcome table, all groups at once: the successors' keys
        (started), their source states and their probabilities."""
        row_off, row_cnt = self._outcome_tables(sig)
        rep = np.repeat(np.arange(len(frontier)), row_cnt)
        first_out = np.cumsum(row_cnt) - row_cnt
        out = row_off[rep] + np.arange(len(rep)) - first_out[rep]
        nxt = np.empty((len(rep), 3 * self.m), dtype=np.int64)
        nxt[:, self.cols_k] = frontier[:, self.cols_k][rep] + self.all_adds[out]
        nxt[:, self.cols_b] = nb[rep]
        nxt[:, self.cols_r] = nr[rep]
        return self.codec.encode(self.start(nxt)), frontier_idx[rep], self.all_probs[out]

    def _assemble(self, count: int, state_chunks: list[np.ndarray], parts: dict[str, list]):
        """(states, transition matrix, reward, τ, done) indexed by state, from the levels' parts."""
        order = np.concatenate(parts["order"])  # the state index of each processed row, level by level
        states = np.empty((count, 3 * self.m), dtype=np.int64)
        states[order] = np.concatenate(state_chunks[: len(parts["order"])])
        reward = np.empty(count)
        reward[order] = np.concatenate(parts["reward"])
        tau = np.empty(count)
        tau[order] = np.concatenate(parts["tau"])
        done = np.empty((count, self.m), dtype=bool)
        done[order] = np.concatenate(parts["done"])
        mat = sp.csr_matrix(
            (np.concatenate(parts["vals"]), (np.concatenate(parts["rows"]), np.concatenate(parts["cols"]))),
            shape=(count, count),
        )
        return states, mat, reward, tau, done
