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
    bvec = np.array(thresholds, dtype=np.int64)
    tick_tab = np.array(ticks, dtype=np.int64)  # [M, N+1]
    # co[j, i]: model j is a co-runner of model i (for the models with a latency alone)
    co = np.zeros((m, m), dtype=np.int64)
    for i, a in enumerate(inputs.alone or ()):
        if a is not None:
            co[list(a.co_runners), i] = 1
    has_alone = co.any(axis=0)
    tps = inputs.tokens_per_step()
    cols_k = np.arange(m) * 3
    cols_b = cols_k + 1
    cols_r = cols_k + 2

    def start(s: np.ndarray) -> np.ndarray:
        k, b = s[:, cols_k], s[:, cols_b]
        go = (b == 0) & (k >= bvec) & (k > 0)
        if go.any():
            ticks_now = tick_tab[np.arange(m)[None, :], np.minimum(k, n)]
            nb = np.where(go, k, b)
            if has_alone.any():  # alone: no co-runner running, the steps starting now included
                lone = has_alone[None, :] & (((nb > 0).astype(np.int64) @ co) == 0)
                ticks_now = np.where(lone, lone_tab[np.arange(m)[None, :], np.minimum(k, n)], ticks_now)
            s[:, cols_b] = nb
            s[:, cols_r] = np.where(go, ticks_now, s[:, cols_r])
            s[:, cols_k] = np.where(go, 0, k)
        return s

    s0 = np.zeros((1, 3 * m), dtype=np.int64)
    s0[0, 3 * inputs.entry] = n
    s0 = start(s0)
    key0 = int(codec.encode(s0)[0])
    index = {key0: 0}
    state_chunks = [s0]
    frontier, frontier_idx = s0, np.array([0])
    count = 1
    rows_l, cols_l, vals_l, reward_l, tau_l, done_l, order_l = [], [], [], [], [], [], []
    # routing-outcome tables by completion signature (the completed batch size of each model), concatenated
    sig_radix = np.int64(n + 1) ** np.arange(m, dtype=np.int64)
    table_at: dict[int, tuple[int, int]] = {}
    adds_l: list[tuple[int, ...]] = []
    probs_l: list[float] = []
    all_adds = all_probs = None
    while len(frontier):
        k, b, r = frontier[:, cols_k], frontier[:, cols_b], frontier[:, cols_r]
        active = b > 0
        dead = ~active.any(axis=1)
        if dead.any():
            d = frontier[np.flatnonzero(dead)[0]]
            raise error_cls(
                "delayed batching deadlocks: every model is idle and no queue reaches its threshold "
                f"(queues {dict(zip(inputs.models, d[cols_k].tolist(), strict=True))}, "
                f"thresholds {dict(zip(inputs.models, thresholds, strict=True))})"
            )
        t = np.where(active, r, np.iinfo(np.int64).max).min(axis=1)
        done = active & (r == t[:, None])
        reward_l.append((np.where(done, b, 0) * tps[None, :]).sum(axis=1))
        tau_l.append(t)
        done_l.append(done)
        order_l.append(frontier_idx)
        nb = np.where(done, 0, b)
        nr = np.where(nb > 0, r - t[:, None], 0)
        sig = np.where(done, b, 0)
        sig_key = sig @ sig_radix
        uniq_sig, first_row, inv = np.unique(sig_key, return_index=True, return_inverse=True)
        for key, row in zip(uniq_sig.tolist(), first_row.tolist(), strict=True):
            if key not in table_at:
                done_set = tuple((i, int(sig[row, i])) for i in range(m) if sig[row, i] > 0)
                table = outcomes.joint(done_set)
                table_at[key] = (len(probs_l), len(table))
                adds_l.extend(a for a, _ in table)
                probs_l.extend(p for _, p in table)
                all_adds, all_probs = None, None
        if all_adds is None:
            all_adds, all_probs = np.array(adds_l, dtype=np.int64).reshape(-1, m), np.array(probs_l)
        # every row of the frontier expanded by its outcome table, all groups at once
        off_c = np.array([table_at[x] for x in uniq_sig.tolist()], dtype=np.int64).reshape(-1, 2)
        row_off, row_cnt = off_c[inv, 0], off_c[inv, 1]
        rep = np.repeat(np.arange(len(frontier)), row_cnt)
        first_out = np.cumsum(row_cnt) - row_cnt
        out = row_off[rep] + np.arange(len(rep)) - first_out[rep]
        nxt = np.empty((len(rep), 3 * m), dtype=np.int64)
        nxt[:, cols_k] = k[rep] + all_adds[out]
        nxt[:, cols_b] = nb[rep]
        nxt[:, cols_r] = nr[rep]
        new_keys_all = [codec.encode(start(nxt))]
        src_all = [frontier_idx[rep]]
        prob_all = [all_probs[out]]
        keys = np.concatenate(new_keys_all)
        uniq, kinv = np.unique(keys, return_inverse=True)
        ids = np.fromiter((index.get(x, -1) for x in uniq.tolist()), dtype=np.int64, count=len(uniq))
        fresh = np.flatnonzero(ids < 0)
        ids[fresh] = np.arange(count, count + len(fresh))
        for x, i in zip(uniq[fresh].tolist(), ids[fresh].tolist(), strict=True):
            index[x] = i
        count += len(fresh)
        if count > max_states:
            raise error_cls(
                f"the chain has more than {max_states} states (raise --max-states, or try a coarser --delta-ms)"
            )
        rows_l.append(np.concatenate(src_all))
        cols_l.append(ids[kinv])
        vals_l.append(np.concatenate(prob_all))
        frontier = codec.decode(uniq[fresh])
        frontier_idx = ids[fresh]
        state_chunks.append(frontier)
    order = np.concatenate(order_l)  # the state index of each processed row, level by level
    states = np.empty((count, 3 * m), dtype=np.int64)
    states[order] = np.concatenate(state_chunks[: len(order_l)])
    reward = np.empty(count)
    reward[order] = np.concatenate(reward_l)
    tau = np.empty(count)
    tau[order] = np.concatenate(tau_l)
    done = np.empty((count, m), dtype=bool)
    done[order] = np.concatenate(done_l)
    mat = sp.csr_matrix(
        (np.concatenate(vals_l), (np.concatenate(rows_l), np.concatenate(cols_l))), shape=(count, count)
    )
    return states, mat, reward, tau, done
