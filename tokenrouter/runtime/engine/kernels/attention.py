"""Paged attention over the request-to-token table (page size 1) as Triton kernels.

One kernel serves decode, extend and prefill. A batch row `b` has `extend_lens[b]` new query tokens
(1 for a decode) at the end of a sequence of `seq_lens[b]` tokens; the K/V of *all* `seq_lens[b]` tokens,
the new ones included, are already in the KV buffers (the caller stores the new tokens' K/V at
`out_cache_loc` before attention), and `req_to_token[req_pool_indices[b], i]` is the KV slot of token
`i`. The new query token `j` sits at position `seq_lens[b] - extend_lens[b] + j` and attends causally to
every position up to and including its own.

Grouped-query attention is folded into the row dimension: one program handles `BLOCK_M` rows of one KV
head, where row `r` is query token `r // GROUP` and query head `kv_head * GROUP + r % GROUP`, so every
K/V tile is read once for the whole group. For long contexts and few rows (decode, small extends) the KV
range is split over `NUM_SPLITS` programs (flash-decoding); a second kernel merges the partial results by
their log-sum-exp. Everything the kernels read about the batch is in tensors, so a captured CUDA graph
replays correctly for any sequence lengths that fit the captured shapes. The launch shape's rules are in
`attention_shapes.py`.

Under `TRITON_INTERPRET=1` (set before this module is imported) the kernels run on CPU tensors, which is
how CI tests them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenrouter.runtime.engine.kernels.attention_shapes import Launch, Overrides, plan_launch
from tokenrouter.runtime.engine.kernels.common import _pdl

_LOG2E = 1.4426950408889634


@triton.jit
def _paged_attn_kernel(
    Q,
    K_buf,
    V_buf,
    Out,
    Mid_O,
    Mid_LSE,
    Tickets,  # FUSED_MERGE: int32 [batch * kv heads * row blocks], zero before the launch and after it
    req_to_token,
    req_pool_indices,
    seq_lens,
    extend_start_loc,
    extend_lens,
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_mt,
    stride_mh,
    stride_ms,
    stride_lt,
    stride_lh,
    stride_r2t,
    num_row_blocks,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    IEEE: tl.constexpr,  # float32 inputs: exact dots, not TF32
    EAGER_LOADS: tl.constexpr = True,  # independent loads issued together (False: the first version's order)
    USE_PDL: tl.constexpr = False,
    # read the first tile's page-table entries and the K/V of tokens before this step before waiting on
    # the previous kernel (PDL; they were written before this forward); this step's K/V and q after
    PREFETCH: tl.constexpr = False,
    # NUM_SPLITS > 1: the last program of a row block to finish (an atomic ticket per row block, which it
    # resets for the next launch) merges the block's partials itself: no `_merge_splits_kernel` launch
    FUSED_MERGE: tl.constexpr = False,
    BLOCK_S: tl.constexpr = 2,  # FUSED_MERGE: NUM_SPLITS rounded up to a power of two
    MERGE_ROWS: tl.constexpr = 2,  # FUSED_MERGE: rows merged at once
):
    if not PREFETCH:
        if USE_PDL:  # wait for the kernel before, then let the next one start
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    kv_head = tl.program_id(1) // num_row_blocks
    row_block = tl.program_id(1) % num_row_blocks
    split = tl.program_id(2)

    ext_len = tl.load(extend_lens + b)
    if EAGER_LOADS:  # the row's four scalars in flight together, not two round trips
        seq_len = tl.load(seq_lens + b)
        q_start = tl.load(extend_start_loc + b)
        req = tl.load(req_pool_indices + b).to(tl.int64)
    if row_block * BLOCK_M >= ext_len * GROUP:
        if PREFETCH:
            if USE_PDL:  # wait for the kernel before, then let the next one start
                tl.extra.cuda.gdc_wait()
                tl.extra.cuda.gdc_launch_dependents()
        return
    if not EAGER_LOADS:
        seq_len = tl.load(seq_lens + b)
        q_start = tl.load(extend_start_loc + b)
        req = tl.load(req_pool_indices + b).to(tl.int64)
    prefix = seq_len - ext_len

    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = tok < ext_len
    q_pos = prefix + tok
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q_row = (q_start + tok).to(tl.int64)

    # The last KV position any row of this block may see (causal), then this program's share of it.
    last_tok = tl.minimum(ext_len - 1, (row_block * BLOCK_M + BLOCK_M - 1) // GROUP)
    kv_hi = prefix + last_tok + 1
    chunk = tl.cdiv(tl.cdiv(kv_hi, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_hi)
    if NUM_SPLITS > 1:
        if lo >= hi:  # a short sequence leaves the last splits empty: mark them so the merge skips them
            if PREFETCH:
                if USE_PDL:  # wait for the kernel before, then let the next one start
                    tl.extra.cuda.gdc_wait()
                    tl.extra.cuda.gdc_launch_dependents()
            if not FUSED_MERGE:  # (the fused merge reads the first cdiv(kv_hi, chunk) splits only)
                tl.store(Mid_LSE + q_row * stride_lt + head * stride_lh + split, float("-inf"), mask=row_ok)
            return

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    r2t_row = req_to_token + req * stride_r2t
    k_col = K_buf + kv_head * stride_kh + offs_d[:, None]  # + loc[None, :] * stride_kt: [D, N]
    v_row = V_buf + kv_head * stride_vh + offs_d[None, :]  # + loc[:, None] * stride_vt: [N, D]
    q_ptrs = Q + q_row[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    first = lo
    if PREFETCH:  # the first tile, split at `prefix`: older tokens' K/V before the wait, new ones after
        offs_n = lo + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        loc = tl.load(r2t_row + offs_n, mask=n_ok, other=0).to(tl.int64)
        old = n_ok & (offs_n < prefix)
        k = tl.load(k_col + loc[None, :] * stride_kt, mask=old[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_row + loc[:, None] * stride_vt, mask=old[:, None] & d_ok[None, :], other=0.0)
        if USE_PDL:  # wait for the kernel before, then let the next one start
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        new = n_ok & (offs_n >= prefix)
        k_new = tl.load(k_col + loc[None, :] * stride_kt, mask=new[None, :] & d_ok[:, None], other=0.0)
        v_new = tl.load(v_row + loc[:, None] * stride_vt, mask=new[:, None] & d_ok[None, :], other=0.0)
        k = tl.where(new[None, :], k_new, k)
        v = tl.where(new[:, None], v_new, v)
        # the online-softmax update of one tile (as in the loop below)
        if IEEE:
            qk = tl.dot(q, k, input_precision="ieee") * qk_scale
        else:
            qk = tl.dot(q, k) * qk_scale
        visible = n_ok[None, :] & (offs_n[None, :] <= q_pos[:, None])
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
        first = lo + BLOCK_N
    else:
        q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    for start in range(first, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        loc = tl.load(r2t_row + offs_n, mask=n_ok, other=0).to(tl.int64)
        k = tl.load(k_col + loc[None, :] * stride_kt, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_row + loc[:, None] * stride_vt, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        if IEEE:
            qk = tl.dot(q, k, input_precision="ieee") * qk_scale
        else:
            qk = tl.dot(q, k) * qk_scale
        visible = n_ok[None, :] & (offs_n[None, :] <= q_pos[:, None])
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        tl.store(
            Out + q_row[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            out.to(Out.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )
    else:
        tl.store(
            Mid_O
            + q_row[:, None] * stride_mt
            + head[:, None] * stride_mh
            + split * stride_ms
            + offs_d[None, :],
            out,
            mask=row_ok[:, None] & d_ok[None, :],
        )
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(Mid_LSE + q_row * stride_lt + head * stride_lh + split, lse, mask=row_ok)
        if FUSED_MERGE:
            # every thread's partials stored before one thread takes the ticket (release, GPU scope); the
            # last of the block's busy splits (the first cdiv(kv_hi, chunk)) sees all of them (acquire)
            tl.debug_barrier()
            ticket_ptr = Tickets + (b * tl.num_programs(1) + tl.program_id(1))
            ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
            busy = tl.cdiv(kv_hi, chunk)
            if ticket == busy - 1:
                tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")  # zero for the next launch
                offs_s = tl.arange(0, BLOCK_S)
                s_ok = offs_s < busy
                # the merge of `_merge_splits_kernel`, MERGE_ROWS rows at a time (their loads in flight
                # together: the merge is this program's serial tail)
                row_end = tl.minimum((row_block + 1) * BLOCK_M, ext_len * GROUP)
                offs_r = tl.arange(0, MERGE_ROWS)
                for r0 in range(row_block * BLOCK_M, row_end, MERGE_ROWS):
                    r = r0 + offs_r
                    r_ok = r < row_end
                    t_r = (q_start + r // GROUP).to(tl.int64)
                    h_r = kv_head * GROUP + r % GROUP
                    rs_ok = r_ok[:, None] & s_ok[None, :]
                    lse_r = tl.load(
                        Mid_LSE + (t_r * stride_lt + h_r * stride_lh)[:, None] + offs_s[None, :],
                        mask=rs_ok,
                        other=float("-inf"),
                        cache_modifier=".cg",  # written by other SMs in this launch: from L2
                    )  # [MERGE_ROWS, BLOCK_S]
                    part = tl.load(
                        Mid_O
                        + (t_r * stride_mt + h_r * stride_mh)[:, None, None]
                        + offs_s[None, :, None] * stride_ms
                        + offs_d[None, None, :],
                        mask=rs_ok[:, :, None] & d_ok[None, None, :],
                        other=0.0,
                        cache_modifier=".cg",
                    )  # [MERGE_ROWS, BLOCK_S, BLOCK_D]
                    m_r = tl.max(lse_r, 1)
                    m_r = tl.where(m_r == float("-inf"), 0.0, m_r)
                    w_r = tl.exp2(lse_r - m_r[:, None])
                    part = tl.where((lse_r > float("-inf"))[:, :, None], part, 0.0)
                    total = tl.sum(w_r, 1)
                    merged = tl.sum(part * w_r[:, :, None], 1) / tl.where(total > 0.0, total, 1.0)[:, None]
                    tl.store(
                        Out + (t_r * stride_ot + h_r * stride_oh)[:, None] + offs_d[None, :],
                        merged.to(Out.dtype.element_ty),
                        mask=r_ok[:, None] & d_ok[None, :],
                    )


@triton.jit
def _merge_splits_kernel(
    Mid_O,
    Mid_LSE,
    Out,
    stride_mt,
    stride_mh,
    stride_ms,
    stride_lt,
    stride_lh,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    EAGER_LOADS: tl.constexpr = True,  # partials loaded with their weights, not after them
    USE_PDL: tl.constexpr = False,
):
    if USE_PDL:  # wait for the kernel before, then let the next one start
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    s_ok = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    lse = tl.load(Mid_LSE + t * stride_lt + h * stride_lh + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)
    mid = Mid_O + t * stride_mt + h * stride_mh + offs_s[:, None] * stride_ms + offs_d[None, :]
    if EAGER_LOADS:  # empty splits wrote no partial: load anyway (valid memory), then drop what they hold
        part = tl.load(mid, mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        part = tl.where(lse[:, None] > float("-inf"), part, 0.0)
    else:
        part = tl.load(mid, mask=s_ok[:, None] & d_ok[None, :] & (lse[:, None] > float("-inf")), other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(part * w[:, None], 0) / tl.where(total > 0.0, total, 1.0)
    tl.store(Out + t * stride_ot + h * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=d_ok)


def _check_contiguous(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, out: torch.Tensor
) -> None:
    if q.stride(2) != 1 or k_buffer.stride(2) != 1 or v_buffer.stride(2) != 1 or out.stride(2) != 1:
        raise ValueError("paged_attention needs q, k/v buffers and out contiguous in head_dim")


def _check_tickets(tickets: torch.Tensor | None, plan: Launch) -> None:
    if plan.fused_merge and (
        tickets.dtype != torch.int32
        or tickets.numel() < plan.batch_size * plan.num_kv_heads * plan.row_blocks
    ):
        raise ValueError("paged_attention: tickets must be int32 with batch * kv_heads * row_blocks entries")


def _split_partials(q: torch.Tensor, out: torch.Tensor, plan: Launch) -> tuple[torch.Tensor, torch.Tensor]:
    """The split partials' buffers (mid_o, mid_lse); `out` twice when the KV range is not split (the kernel
    does not touch them then)."""
    if plan.num_splits == 1:
        return out, out
    num_tokens, num_q_heads, head_dim = q.shape
    shape = (num_tokens, num_q_heads, plan.num_splits)
    mid_o = torch.empty((*shape, head_dim), dtype=torch.float32, device=q.device)
    return mid_o, torch.empty(shape, dtype=torch.float32, device=q.device)


def _strides(split: bool, *tensors: torch.Tensor) -> tuple[int, ...]:
    """The main kernel's strides: tokens and heads of q, k_buffer, v_buffer and out; tokens, heads and
    splits of mid_o, tokens and heads of mid_lse (zeros when the KV range is not split); the table's rows."""
    q, k_buffer, v_buffer, out, mid_o, mid_lse, req_to_token = tensors
    mid = (*mid_o.stride()[:3], *mid_lse.stride()[:2]) if split else (0, 0, 0, 0, 0)
    heads = (*q.stride()[:2], *k_buffer.stride()[:2], *v_buffer.stride()[:2], *out.stride()[:2])
    return (*heads, *mid, req_to_token.stride(0))


def _launch_attention(
    plan: Launch,
    tensors: tuple[torch.Tensor, ...],
    tickets: torch.Tensor | None,
    batch: tuple[torch.Tensor, ...],
    sm_scale: float,
    eager_loads: bool,
    prefetch: bool,
    pdl: bool,
) -> None:
    """The main kernel. `tensors`: (q, k_buffer, v_buffer, out, mid_o, mid_lse); `batch`: (req_to_token,
    req_pool_indices, seq_lens, extend_start_loc, extend_lens)."""
    q = tensors[0]
    seq_lens = batch[2]
    _paged_attn_kernel[plan.grid()](
        *tensors,
        tickets if plan.fused_merge else seq_lens,
        *batch,
        sm_scale * _LOG2E,
        *_strides(plan.num_splits > 1, *tensors, batch[0]),
        plan.row_blocks,
        **plan.constexprs(q, eager_loads, prefetch),
        **_pdl(pdl, q.device),
    )


def _launch_merge(
    plan: Launch,
    q: torch.Tensor,
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
    out: torch.Tensor,
    eager_loads: bool,
    pdl: bool,
) -> None:
    """The second kernel: merges the split partials by their log-sum-exp, one program per (token, head)."""
    _merge_splits_kernel[(q.shape[0], q.shape[1])](
        mid_o,
        mid_lse,
        out,
        *mid_o.stride()[:3],
        *mid_lse.stride()[:2],
        *out.stride()[:2],
        HEAD_DIM=plan.head_dim,
        BLOCK_D=plan.block_d,
        NUM_SPLITS=plan.num_splits,
        BLOCK_S=plan.block_s,
        EAGER_LOADS=eager_loads,
        num_warps=4 if plan.block_d >= 128 else 2,
        **_pdl(pdl, q.device),
    )


def paged_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_lens: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    num_splits: int | None = None,
    block_m: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    eager_loads: bool = True,
    pdl: bool = False,
    prefetch: bool = False,
    tickets: torch.Tensor | None = None,
    block_n: int | None = None,
    fused_rows: int | None = None,
    merge_passes: int = 0,
) -> torch.Tensor:
    """Attention for a ragged batch over paged KV; writes and returns `out` [T, q_heads, head_dim].

    q [T, q_heads, head_dim]: the batch's new tokens, request after request (`extend_start_loc[b]` is
    row b's first). k_buffer / v_buffer [slots, kv_heads, head_dim] hold the K/V of every token the
    batch attends to, the new ones included. `max_extend_len` bounds `extend_lens` (it sizes the grid).
    `num_splits` None picks a split count from the launch shape (see `choose_num_splits`); `block_m`
    (rows per program), `block_n` (KV tokens per tile, a power of two >= 16), `num_warps`, `num_stages`
    override the kernel's launch options (for tuning);
    `eager_loads=False` issues the kernels' independent loads in the order of their first measured version;
    `pdl` launches both kernels with programmatic dependent launch where supported (see `_pdl`);
    `prefetch` reads the first KV tile of older tokens before waiting on the previous kernel (for PDL;
    the caller guarantees the page table and the older tokens' K/V were written before that kernel).
    `tickets` (int32, zeros, at least batch_size * kv_heads * row blocks; see `attention_tickets`): with a
    split KV range, the last program of each row block merges the partials (no second launch) and leaves
    its ticket at zero again, so one buffer serves every launch and graph replay on its stream. It does so
    for row blocks of up to `fused_rows` rows (default FUSED_MERGE_MAX_ROWS), and with `merge_passes` P > 0
    for every row block whose partials it loads in at most P passes of `fused_merge_rows` rows."""
    _check_contiguous(q, k_buffer, v_buffer, out)
    num_kv_heads, batch_size = k_buffer.shape[1], seq_lens.shape[0]
    if q.shape[0] == 0 or batch_size == 0:
        return out
    opts = Overrides(num_splits, block_m, block_n, num_warps, num_stages, fused_rows, merge_passes)
    plan = plan_launch(q, num_kv_heads, batch_size, max_extend_len, tickets is not None, opts)
    mid_o, mid_lse = _split_partials(q, out, plan)
    _check_tickets(tickets, plan)
    batch = (req_to_token, req_pool_indices, seq_lens, extend_start_loc, extend_lens)
    tensors = (q, k_buffer, v_buffer, out, mid_o, mid_lse)
    _launch_attention(plan, tensors, tickets, batch, sm_scale, eager_loads, prefetch, pdl)
    if plan.num_splits > 1 and not plan.fused_merge:
        _launch_merge(plan, q, mid_o, mid_lse, out, eager_loads, pdl)
    return out
