"""Triton kernels for the GPU fast path: paged attention over the request-to-token table (page size 1),
and the small fused element-wise ops that keep a decode step's launch count low.

Paged attention
---------------
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
replays correctly for any sequence lengths that fit the captured shapes.

Under `TRITON_INTERPRET=1` (set before this module is imported) the kernels run on CPU tensors, which is
how CI tests them.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from tokenrouter.runtime.engine.attention import tuned_tiles

_LOG2E = 1.4426950408889634


# Programmatic dependent launch (PDL, sm_90+): a kernel launched with it may start while the kernel before
# it in the stream is still running. Each kernel here that takes USE_PDL waits (`gdc_wait`) for the kernel
# before it to finish, and for its writes to be visible, before it reads anything a kernel wrote or writes
# anything, and then lets the next kernel start (`gdc_launch_dependents`); the GEMV issues its first weight
# tile before waiting (weights are never written), so that read overlaps the previous kernel's tail. Every
# program of a PDL kernel waits before it ends, so a kernel's end still implies the end of all before it.
# In a CUDA graph the launches become programmatic edges. Not under the interpreter (CPU).
def _pdl_supported() -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        return "launch_pdl" in CUDAOptions.__dataclass_fields__ and hasattr(tl.extra.cuda, "gdc_wait")
    except Exception:  # another backend, or a Triton without it
        return False


PDL_SUPPORTED = _pdl_supported()

# Autotuning results on disk. Each autotuned kernel below (the linear layers) times every candidate tile
# config per (N, K, variant) the first time a process runs it: on the H200 that is most of an engine's
# start once Triton's compiled kernels are cached (docs/benchmarks.md, run O, "Engine start": 0.6B 26.8 s
# -> 9.4 s). With the results cached, Triton keeps each choice in its cache directory (TRITON_CACHE_DIR,
# default ~/.triton/cache), keyed by the Triton version, the GPU architecture, the kernel's source, the
# tuning key and the candidate configs, so a later process on the same kind of GPU reuses it instead of
# timing the candidates again (and every process picks the same tiles). TOKENROUTER_AUTOTUNE_CACHE=0 times
# them afresh in every process, as before. `dot_rows` may skip its autotuner for configs timed in the graph
# step (`tuned_tiles`).
AUTOTUNE_CACHE_ENV = "TOKENROUTER_AUTOTUNE_CACHE"


def autotune_cache_enabled() -> bool:
    """Whether the linear kernels' autotuners keep their results on disk (`AUTOTUNE_CACHE_ENV`, default on);
    ValueError naming a bad value (the Triton attention backend checks it when an engine is built)."""
    raw = os.environ.get(AUTOTUNE_CACHE_ENV, "").strip().lower()
    if raw in ("", "1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise ValueError(
        f"{AUTOTUNE_CACHE_ENV}={raw!r}: expected 1 (keep autotuning results on disk, the default) or 0"
    )


def _autotune(configs: list, key: list[str], **kwargs):
    """`triton.autotune` with its results cached on disk unless `AUTOTUNE_CACHE_ENV` says otherwise (a bad
    value counts as the default here: the error comes when an engine is built)."""
    try:
        cache = autotune_cache_enabled()
    except ValueError:
        cache = True
    return triton.autotune(configs=configs, key=key, cache_results=cache, **kwargs)


@functools.lru_cache(maxsize=16)
def _sm90_or_later(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _pdl(want: bool, device: torch.device) -> dict:
    """Launch options and the USE_PDL flag for one launch: PDL only where it is wanted and supported."""
    on = bool(want) and PDL_SUPPORTED and _sm90_or_later(device)
    return {"USE_PDL": True, "launch_pdl": True} if on else {"USE_PDL": False}


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
    EAGER_LOADS: tl.constexpr = True,  # independent loads issued together (False: the order of runs A/B)
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


FUSED_MERGE_MAX_ROWS = 4  # `paged_attention(tickets=...)` merges in the kernel up to this many rows per block
# ... and (`merge_passes` P > 0) every larger row block whose merge takes at most P passes, one pass loading
# the partials of as many rows at once as FUSED_MERGE_TILE floats hold (64 registers per thread at 4 warps):
# a row block with few splits (many programs: bs 4 and more) merges its 8-16 rows in one pass, where the tail
# of the small blocks merges 2 rows per pass. Run R (docs/benchmarks.md), 0.6B on the H200: one pass is
# 0.94-0.98x the step time of the merge launch (bs 4 x 4, 16 x 4, 16 x 8); two passes (bs 4 x 8: 16 rows at
# 8 splits) 1.03-1.07x, and one pass of twice this tile there 1.04-1.15x
FUSED_MERGE_TILE = 8192


def fused_merge_rows(block_rows: int, block_s: int, block_d: int, num_warps: int, passes: int) -> int:
    """Rows the fused merge loads per pass: 2, or (passes > 0) as many of the block's rows as the tile
    budget allows for `block_s` splits of `block_d` floats (a power of two, 2 to the block's rows)."""
    if passes <= 0:
        return 2
    fit = FUSED_MERGE_TILE * num_warps // 4 // (block_s * block_d)
    return max(2, min(triton.next_power_of_2(block_rows), 1 << max(fit, 1).bit_length() - 1))


def attention_tickets(batch_size: int, num_kv_heads: int, max_extend_len: int, group: int) -> int:
    """Ticket entries `paged_attention(tickets=...)` needs for a launch shape."""
    rows = max_extend_len * group
    return batch_size * num_kv_heads * -(-rows // row_block_size(rows))


@functools.lru_cache(maxsize=16)
def num_sms(device: torch.device) -> int:
    """The device's SM count, which the split rule and the backend's KV tile rule size grids by."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1  # the CPU interpreter runs programs one by one: splitting only costs time there


def row_block_size(rows: int) -> int:
    """Query rows (new tokens x query heads per KV head) one attention program takes."""
    return 16 if rows <= 16 else (32 if rows <= 32 else 64)


# `paged_attention`'s default (num_stages None): row blocks of at most this many query rows run the KV loop
# unpipelined. From run B's sweep (docs/benchmarks.md; bs 16, ctx 4096, before PDL): decode rows fastest with
# 1 stage, 16-row blocks with 2, 32-row blocks with 3. The engine's backend picks per step kind instead
# (triton_backend.ATTN_DECODE_SINGLE_STAGE_BS: run T measured extends pipelined faster at every such block).
SINGLE_STAGE_ROWS = 8


def attention_stages(rows: int, block_m: int, single_stage_rows: int = SINGLE_STAGE_ROWS) -> int:
    """Pipeline stages of the attention's KV loop for `rows` query rows in blocks of `block_m`."""
    return 1 if rows <= single_stage_rows else (3 if block_m == 32 else 2)


# Split cap for decode-sized row blocks. A split's KV range is ceil(kv_len / splits) rounded up to the
# kernel's 64-token tile, so the splits that do work grow with the context (ctx 512: 8 busy programs per
# KV head, ctx 4096: 64) while the grid stays fixed for a captured graph; empty splits return at once.
# 16 (the cap measured in runs A and B) left bs-1 steps at ctx 4096 with 4 serial tiles per program.
MAX_SPLITS = 64
MAX_SPLITS_OLD = 16


def choose_num_splits(
    batch_size: int,
    num_kv_heads: int,
    row_blocks: int,
    device: torch.device,
    max_splits: int = MAX_SPLITS,
) -> int:
    """How many programs share one row block's KV range: about one program per SM (rounded up to a power
    of two). Two waves (the rule before) gave bs 1 with 8 KV heads 64 splits; the decode attention sweep on
    the H200 (docs/benchmarks.md, "Decode attention at bs 1") measured 32 faster at ctx 4096 (0.6B 13.4 ->
    11.1 us per layer, 8B 15.9 -> 12.7) and at ctx 512 (5.8 -> 4.9, 7.5 -> 5.8): fewer partials to write and
    merge, and the merging program's serial tail reads half as many. Rounding down for extends instead, so
    that fewer, longer programs still cover 90 % of the SMs and a 16-row block's merge fits one pass in the
    kernel, was 1.04-1.76x slower at every bs 4 and 16 extend (run T, call 1): the split programs are latency
    bound, and two per SM hide each other's loads.

    Depends only on the launch shape (never on sequence lengths), so a captured graph stays valid."""
    programs = max(1, batch_size * num_kv_heads * row_blocks)
    sms = num_sms(device)
    splits = triton.next_power_of_2(math.ceil(sms / programs))
    return max(1, min(max_splits, splits))


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
    `eager_loads=False` issues the kernels' independent loads in the order of the measured runs A/B;
    `pdl` launches both kernels with programmatic dependent launch where supported (see `_pdl`);
    `prefetch` reads the first KV tile of older tokens before waiting on the previous kernel (for PDL;
    the caller guarantees the page table and the older tokens' K/V were written before that kernel).
    `tickets` (int32, zeros, at least batch_size * kv_heads * row blocks; see `attention_tickets`): with a
    split KV range, the last program of each row block merges the partials (no second launch) and leaves
    its ticket at zero again, so one buffer serves every launch and graph replay on its stream. It does so
    for row blocks of up to `fused_rows` rows (default FUSED_MERGE_MAX_ROWS), and with `merge_passes` P > 0
    for every row block whose partials it loads in at most P passes of `fused_merge_rows` rows."""
    num_tokens, num_q_heads, head_dim = q.shape
    if q.stride(2) != 1 or k_buffer.stride(2) != 1 or v_buffer.stride(2) != 1 or out.stride(2) != 1:
        raise ValueError("paged_attention needs q, k/v buffers and out contiguous in head_dim")
    num_kv_heads = k_buffer.shape[1]
    group = num_q_heads // num_kv_heads
    batch_size = seq_lens.shape[0]
    if num_tokens == 0 or batch_size == 0:
        return out
    rows = max_extend_len * group
    if block_m is None:
        block_m = row_block_size(rows)
    if num_stages is None:
        num_stages = attention_stages(rows, block_m)
    row_blocks = triton.cdiv(rows, block_m)
    if num_splits is None:
        num_splits = 1 if rows > 64 else choose_num_splits(batch_size, num_kv_heads, row_blocks, q.device)
    block_d = triton.next_power_of_2(head_dim)
    if block_n is None:
        block_n = 64 if block_d <= 128 else 32
    elif block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"paged_attention: block_n must be a power of two >= 16, got {block_n}")
    if num_splits > 1:
        mid_o = torch.empty(
            (num_tokens, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        mid_lse = torch.empty((num_tokens, num_q_heads, num_splits), dtype=torch.float32, device=q.device)
    else:
        mid_o = mid_lse = out  # unused by the kernel when NUM_SPLITS == 1
    # the fused merge is one program's serial tail: for the few rows of a decode (or a 2-token extend at
    # GQA 2), and (merge_passes) for row blocks it merges in that many passes; more rows merge in the
    # second kernel, one program per row
    block_s = max(2, triton.next_power_of_2(num_splits))
    few = rows <= (fused_rows or FUSED_MERGE_MAX_ROWS)  # these keep the merge of 2 rows a pass
    block_rows = min(rows, block_m)
    merge_rows = 2 if few else fused_merge_rows(block_rows, block_s, block_d, num_warps, merge_passes)
    passes = -(-block_rows // merge_rows)
    fused_merge = num_splits > 1 and tickets is not None and (few or passes <= merge_passes)
    if fused_merge and (
        tickets.dtype != torch.int32 or tickets.numel() < batch_size * num_kv_heads * row_blocks
    ):
        raise ValueError("paged_attention: tickets must be int32 with batch * kv_heads * row_blocks entries")
    _paged_attn_kernel[(batch_size, num_kv_heads * row_blocks, num_splits)](
        q,
        k_buffer,
        v_buffer,
        out,
        mid_o,
        mid_lse,
        tickets if fused_merge else seq_lens,
        req_to_token,
        req_pool_indices,
        seq_lens,
        extend_start_loc,
        extend_lens,
        sm_scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        out.stride(0),
        out.stride(1),
        mid_o.stride(0) if num_splits > 1 else 0,
        mid_o.stride(1) if num_splits > 1 else 0,
        mid_o.stride(2) if num_splits > 1 else 0,
        mid_lse.stride(0) if num_splits > 1 else 0,
        mid_lse.stride(1) if num_splits > 1 else 0,
        req_to_token.stride(0),
        row_blocks,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        IEEE=q.dtype == torch.float32,
        EAGER_LOADS=eager_loads,
        PREFETCH=prefetch,
        FUSED_MERGE=fused_merge,
        BLOCK_S=block_s,
        MERGE_ROWS=merge_rows,
        num_warps=num_warps,
        num_stages=num_stages,
        **_pdl(pdl, q.device),
    )
    if num_splits > 1 and not fused_merge:
        _merge_splits_kernel[(num_tokens, num_q_heads)](
            mid_o,
            mid_lse,
            out,
            mid_o.stride(0),
            mid_o.stride(1),
            mid_o.stride(2),
            mid_lse.stride(0),
            mid_lse.stride(1),
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            NUM_SPLITS=num_splits,
            BLOCK_S=block_s,
            EAGER_LOADS=eager_loads,
            num_warps=4 if block_d >= 128 else 2,
            **_pdl(pdl, q.device),
        )
    return out


# ---------------------------------------------------------------------------------------------------------
# Fused element-wise ops. In a CUDA-graph decode step of a small model (0.6B: 28 layers) the time goes to
# the number of kernels, not to bytes: eager RMSNorm alone is ~7 launches. These fold each group of
# element-wise ops into one launch. All math is in float32; results are cast to the input dtype once.
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _rmsnorm_kernel(
    X,
    Residual,
    W,
    Out,
    Rows,
    stride_x,
    stride_r,
    stride_o,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr = False,
    GATHER: tl.constexpr = False,  # program i reads row Rows[i] of X / Residual, writes row i of Out
):
    if USE_PDL:  # wait for the kernel before, then let the next one start
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if GATHER:
        out_row = tl.program_id(0).to(tl.int64)
        row = tl.load(Rows + out_row).to(tl.int64)
    else:
        row = tl.program_id(0).to(tl.int64)
        out_row = row
    offs = tl.arange(0, BLOCK)
    ok = offs < n_cols
    x = tl.load(X + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(Residual + row * stride_r + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(Residual + row * stride_r + offs, x.to(Residual.dtype.element_ty), mask=ok)
        x = x.to(Residual.dtype.element_ty).to(tl.float32)
    var = tl.sum(x * x, 0) / n_cols
    w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(var + eps)
    tl.store(Out + out_row * stride_o + offs, (y * w).to(Out.dtype.element_ty), mask=ok)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    pdl: bool = False,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dim of a 2-D `x`. With `residual`: `residual += x` in place first, then the
    norm of the sum (the pre-norm decoder's "add & norm" in one launch). Returns the normalised rows.
    With `rows` (a 1-D index tensor): only those rows, out[i] = norm of row rows[i] (with `residual`,
    only those rows of it are updated): the decoder's final norm of the last tokens without a gather."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError("rmsnorm needs a 2-D tensor contiguous in its last dim")
    if rows is not None and (rows.dim() != 1 or rows.stride(0) != 1):
        raise ValueError("rmsnorm: rows must be a contiguous 1-D index tensor")
    n_rows, n_cols = x.shape if rows is None else (rows.shape[0], x.shape[1])
    if out is None:
        out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return out
    block = triton.next_power_of_2(n_cols)
    _rmsnorm_kernel[(n_rows,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        rows if rows is not None else x,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        n_cols,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=min(16, max(1, block // 256)),
        GATHER=rows is not None,
        **_pdl(pdl, x.device),
    )
    return out


@triton.jit
def _qk_norm_rope_store_kernel(
    QKV,
    Q_out,
    K_buf,
    V_buf,
    out_cache_loc,
    positions,
    cos_sin,
    QW,
    KW,
    stride_qkv,
    stride_qo_t,
    stride_qo_h,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cs,
    eps,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_NORM: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    if USE_PDL:  # wait for the kernel before, then let the next one start
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)  # 0: query heads, 1: key heads (+ the values)
    HALF: tl.constexpr = HEAD_DIM // 2
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HALF)
    pos = tl.load(positions + t).to(tl.int64)
    cos = tl.load(cos_sin + pos * stride_cs + offs_d)[None, :]
    sin = tl.load(cos_sin + pos * stride_cs + HALF + offs_d)[None, :]
    if part == 0:
        n_heads = NUM_Q_HEADS
        head0 = 0
    else:
        n_heads = NUM_KV_HEADS
        head0 = NUM_Q_HEADS
    h_ok = (offs_h < n_heads)[:, None]
    base = QKV + t * stride_qkv + (head0 + offs_h)[:, None] * HEAD_DIM
    x1 = tl.load(base + offs_d[None, :], mask=h_ok, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + offs_d[None, :], mask=h_ok, other=0.0).to(tl.float32)
    if HAS_NORM:
        if part == 0:
            w1 = tl.load(QW + offs_d).to(tl.float32)[None, :]
            w2 = tl.load(QW + HALF + offs_d).to(tl.float32)[None, :]
        else:
            w1 = tl.load(KW + offs_d).to(tl.float32)[None, :]
            w2 = tl.load(KW + HALF + offs_d).to(tl.float32)[None, :]
        inv = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / HEAD_DIM + eps)[:, None]
        x1 = x1 * inv * w1
        x2 = x2 * inv * w2
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    if part == 0:
        dst = Q_out + t * stride_qo_t + offs_h[:, None] * stride_qo_h
        tl.store(dst + offs_d[None, :], y1.to(Q_out.dtype.element_ty), mask=h_ok)
        tl.store(dst + HALF + offs_d[None, :], y2.to(Q_out.dtype.element_ty), mask=h_ok)
    else:
        loc = tl.load(out_cache_loc + t).to(tl.int64)
        dst = K_buf + loc * stride_kt + offs_h[:, None] * stride_kh
        tl.store(dst + offs_d[None, :], y1.to(K_buf.dtype.element_ty), mask=h_ok)
        tl.store(dst + HALF + offs_d[None, :], y2.to(K_buf.dtype.element_ty), mask=h_ok)
        offs_full = tl.arange(0, HEAD_DIM)
        vsrc = QKV + t * stride_qkv + (NUM_Q_HEADS + NUM_KV_HEADS + offs_h)[:, None] * HEAD_DIM
        v = tl.load(vsrc + offs_full[None, :], mask=h_ok, other=0.0)
        vdst = V_buf + loc * stride_vt + offs_h[:, None] * stride_vh + offs_full[None, :]
        tl.store(vdst, v.to(V_buf.dtype.element_ty), mask=h_ok)


def qk_norm_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out_cache_loc: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    q_out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """From the merged qkv projection [T, (Hq + 2 Hkv) * D]: per-head RMSNorm of q and k (Qwen3; skipped
    when no weights are given), rotary embedding (rotate-half / NeoX layout) at `positions`, the new K and
    V stored into the KV buffers at `out_cache_loc`, and the rotated queries returned as [T, Hq, D].

    `cos_sin` [max_pos, D]: cos in the first half of a row, sin in the second, float32."""
    if head_dim & (head_dim - 1) or head_dim < 2:
        raise ValueError(f"qk_norm_rope_store needs a power-of-two head_dim, got {head_dim}")
    if qkv.stride(1) != 1 or cos_sin.stride(1) != 1:
        raise ValueError("qk_norm_rope_store needs qkv and cos_sin contiguous in their last dim")
    num_tokens = qkv.shape[0]
    if q_out is None:
        q_out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return q_out
    has_norm = q_norm_weight is not None
    _qk_norm_rope_store_kernel[(num_tokens, 2)](
        qkv,
        q_out,
        k_buffer,
        v_buffer,
        out_cache_loc,
        positions,
        cos_sin,
        q_norm_weight if has_norm else qkv,
        k_norm_weight if has_norm else qkv,
        qkv.stride(0),
        q_out.stride(0),
        q_out.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        cos_sin.stride(0),
        eps,
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(max(num_q_heads, num_kv_heads)),
        HAS_NORM=has_norm,
        num_warps=4,
        **_pdl(pdl, qkv.device),
    )
    return q_out


@triton.jit
def _silu_and_mul_kernel(
    X, Out, stride_x, stride_o, n_cols, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False
):
    if USE_PDL:  # wait for the kernel before, then let the next one start
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n_cols
    gate = tl.load(X + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + n_cols + offs, mask=ok, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(Out + row * stride_o + offs, y.to(Out.dtype.element_ty), mask=ok)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """SiLU(gate) * up for the merged gate_up projection [T, 2 I] -> [T, I]."""
    if x.dim() != 2 or x.stride(1) != 1 or x.shape[1] % 2:
        raise ValueError("silu_and_mul needs a 2-D [T, 2*I] tensor contiguous in its last dim")
    n_rows, n_cols = x.shape[0], x.shape[1] // 2
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device) if out is None else out
    if n_rows == 0:
        return out
    block = min(4096, triton.next_power_of_2(n_cols))
    _silu_and_mul_kernel[(n_rows, triton.cdiv(n_cols, block))](
        x, out, x.stride(0), out.stride(0), n_cols, BLOCK=block, num_warps=4, **_pdl(pdl, x.device)
    )
    return out


@triton.jit
def _store_kv_kernel(
    K,
    V,
    K_buf,
    V_buf,
    loc_ptr,
    stride_k,
    stride_v,
    stride_kb,
    stride_vb,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    loc = tl.load(loc_ptr + t).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < ROW
    k = tl.load(K + t * stride_k + offs, mask=ok)
    tl.store(K_buf + loc * stride_kb + offs, k.to(K_buf.dtype.element_ty), mask=ok)
    v = tl.load(V + t * stride_v + offs, mask=ok)
    tl.store(V_buf + loc * stride_vb + offs, v.to(V_buf.dtype.element_ty), mask=ok)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor
) -> None:
    """k_buffer[loc] = k; v_buffer[loc] = v in one launch (k, v [T, kv_heads, head_dim])."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    k = k.reshape(num_tokens, -1)
    v = v.reshape(num_tokens, -1)
    if (
        k.stride(1) != 1
        or v.stride(1) != 1
        or not (k_buffer[0].is_contiguous() and v_buffer[0].is_contiguous())
    ):
        raise ValueError("store_kv needs k, v and the buffers contiguous per token")
    row = k.shape[1]
    block = min(1024, triton.next_power_of_2(row))
    _store_kv_kernel[(num_tokens, triton.cdiv(row, block))](
        k,
        v,
        k_buffer,
        v_buffer,
        loc,
        k.stride(0),
        v.stride(0),
        k_buffer.stride(0),
        v_buffer.stride(0),
        ROW=row,
        BLOCK=block,
        num_warps=4,
    )


# ---------------------------------------------------------------------------------------------------------
# One-row linear layers (GEMV). A batch-1 decode step multiplies one row by each weight matrix; cuBLAS runs
# these few-megabyte GEMVs far below the copy bandwidth (measured on the H200: 12.4 us for Qwen3-0.6B's
# 12.6 MB gate_up, about 1 TB/s). This kernel spreads the output columns over many programs, reads each
# weight tile once with wide contiguous loads, and can fuse SiLU(gate) * up into its input load
# (down_proj). Only for one row (`gemv_rows` below takes 2-8 rows, `dot_rows` at the end 1-16 on tensor
# cores; run B's tensor-core variant with the rows on the MMA's M side measured slower than cuBLAS).
# ---------------------------------------------------------------------------------------------------------

_GEMV_TILES_BASE = [  # the tile shapes of runs A/B (docs/benchmarks.md)
    (4, 1024, 4, 1),
    (8, 512, 4, 2),
    (8, 1024, 4, 1),
    (8, 1024, 8, 2),
    (16, 256, 4, 3),
    (16, 512, 4, 2),
    (16, 512, 8, 3),
    (32, 256, 4, 3),
]
_GEMV_TILES_EXTRA = [  # more rows per program with more warps (the 0.6B matrices are 1024 wide), and
    # fewer rows with wider loads (more bytes in flight per program)
    (2, 1024, 4, 1),
    (4, 2048, 8, 1),
    (8, 2048, 8, 1),
    (16, 1024, 8, 1),
    (32, 512, 8, 1),
    (64, 256, 8, 2),
]


def _tile_configs(tiles) -> list:
    """Autotune configs of the GEMV kernels from (BLOCK_N, BLOCK_K, warps, stages) tuples."""
    return [
        triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s) for bn, bk, w, s in tiles
    ]


_GEMV_CONFIGS_BASE = _tile_configs(_GEMV_TILES_BASE)
_GEMV_CONFIGS = _GEMV_CONFIGS_BASE + _tile_configs(_GEMV_TILES_EXTRA)


@triton.jit
def _gemv_kernel(
    X,
    W,
    Bias,
    Y,
    R,
    R_out,
    NW,
    N,
    K,
    stride_wn,
    eps,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,  # X is [gate | up] of width 2K: the input is SiLU(gate) * up
    NORM: tl.constexpr,  # the input is RMSNorm(h) * NW, h = X (+ R when HAS_RES)
    HAS_RES: tl.constexpr,  # h = X + R, and program 0 writes h to R_out (the new residual stream)
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn
    # NORM in one pass: out = rstd * sum_k w_k * (h_k * nw_k), with rstd = rsqrt(mean(h^2) + eps) from the
    # same pass (a scalar: it factors out of the dot). No pass before the weight loads start.
    # Each iteration loads the next tile's weights after its own math; the first tile's are loaded before
    # waiting on the previous kernel (PDL: weights are never written).
    offs_k = tl.arange(0, BLOCK_K)
    w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & (offs_k < K)[None, :], other=0.0)
    if USE_PDL:  # wait for the kernel before, then let the next one start
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    ss = tl.zeros([BLOCK_K], dtype=tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(X + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        if SILU_MUL:
            up = tl.load(X + K + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            x = (x / (1.0 + tl.exp(-x)) * up).to(W.dtype.element_ty).to(tl.float32)
        if NORM:
            if HAS_RES:  # h = x + residual, kept in the model dtype (as `rmsnorm` stores it)
                h = (x + tl.load(R + offs_k, mask=k_ok, other=0.0).to(tl.float32)).to(R_out.dtype.element_ty)
                if pid == 0:
                    tl.store(R_out + offs_k, h, mask=k_ok)
                x = h.to(tl.float32)
            ss += x * x
            x = x * tl.load(NW + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
        nxt = offs_k + BLOCK_K  # the last iteration's load is fully masked: no memory traffic
        w = tl.load(w_rows + nxt[None, :], mask=n_ok[:, None] & (nxt < K)[None, :], other=0.0)
    out = tl.sum(acc, 1)
    if NORM:
        out = out * tl.rsqrt(tl.sum(ss, 0) / K + eps)
    if HAS_BIAS:
        out += tl.load(Bias + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(Y + offs_n, out.to(Y.dtype.element_ty), mask=n_ok)


# the GEMV autotuner's key (and a tuned tile table's, `tuned_tiles`): the layer's shape and the variant
GEMV_KEY = ["N", "K", "SILU_MUL", "NORM", "HAS_RES", "USE_PDL"]
if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter cannot autotune: one fixed config
    _gemv = _gemv_base = _gemv_kernel
    _FIXED = {"BLOCK_N": 16, "BLOCK_K": 32}
else:
    _gemv = _autotune(_GEMV_CONFIGS, GEMV_KEY)(_gemv_kernel)
    _gemv_base = _autotune(_GEMV_CONFIGS_BASE, GEMV_KEY)(_gemv_kernel)
    _FIXED = {}


def _linear_variant(fn, shape, x, weight, bias, silu_mul, norm_weight, residual, residual_out) -> tuple:
    """The input variants of the linear kernels (`gemv`, `gemv_rows`, `dot_rows`), checked (ValueErrors named
    after `fn`: x's width matches the weight (2K with `silu_mul`), the norm and SiLU * up do not combine, and a
    residual comes with `residual_out` and a norm, both contiguous and shaped like x (`shape` in the message),
    and distinct) and turned into what every launch passes: the (Bias, R, R_out, NW) pointers (x or the
    weight standing in for absent ones) and the HAS_BIAS / SILU_MUL / NORM / HAS_RES flags."""
    k = weight.shape[1]
    if x.shape[1] != (2 * k if silu_mul else k):
        raise ValueError(f"{fn}: input width {x.shape[1]} does not match the weight {tuple(weight.shape)}")
    norm = norm_weight is not None
    if norm and silu_mul:
        raise ValueError(f"{fn}: norm_weight and silu_mul do not combine")
    if (residual is None) != (residual_out is None) or (residual is not None and not norm):
        raise ValueError(f"{fn}: residual needs residual_out and norm_weight")
    if residual is not None:
        for t in (residual, residual_out):
            if t.shape != x.shape or not t.is_contiguous():
                raise ValueError(f"{fn}: residual and residual_out must be contiguous {shape} like x")
        if residual_out.data_ptr() == residual.data_ptr():
            raise ValueError(f"{fn}: residual_out must not be residual (other programs still read it)")
    pointers = (
        bias if bias is not None else weight,
        residual if residual is not None else x,
        residual_out if residual_out is not None else x,
        norm_weight if norm else weight,
    )
    flags = dict(HAS_BIAS=bias is not None, SILU_MUL=silu_mul, NORM=norm, HAS_RES=residual is not None)
    return pointers, flags


def _tuned_config(
    kernel: str, x: torch.Tensor, n: int, k: int, flags: dict, use_pdl: bool, **extra
) -> dict | None:
    """The tuned tables' config for a linear kernel's launch (`tuned_tiles.lookup`; key: N, K, the variant flags
    of `_linear_variant` but the bias, USE_PDL and the kernel's `extra` fields), or None."""
    key = {name: flags[name] for name in ("SILU_MUL", "NORM", "HAS_RES")}
    return tuned_tiles.lookup(kernel, x.device, x.dtype, N=n, K=k, USE_PDL=use_pdl, **key, **extra)


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu_mul: bool = False,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    extra_tiles: bool = True,
    pdl: bool = False,
    tuned: bool = False,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for one row x [1, K] -> [1, N]. Autotuned per (N, K, variant) on first
    use (so run it once before a CUDA graph capture); `extra_tiles=False` autotunes over the tile shapes
    of the measured runs A/B only (for side-by-side timing); `pdl`: programmatic dependent launch where
    supported (see `_pdl`; the first weight tile is read before waiting on the previous kernel). With
    `tuned` (and `extra_tiles`), a config measured fastest inside the CUDA graph step for this GPU model,
    dtype and tuning key (`tuned_tiles.lookup`) replaces the autotuner's choice where the tables have one.

    Input variants: with `silu_mul`, x is [1, 2K] = [gate | up] and the input is SiLU(gate) * up. With
    `norm_weight`, the input is `rmsnorm(h, norm_weight, eps)` of h = x, or with `residual` h = x +
    residual (rounded to the model dtype, as `rmsnorm` keeps the stream), which is also written to
    `residual_out` (a different [1, K] tensor): the decoder's add & norm folded into the next linear
    layer, one launch fewer. The normed row is not rounded to the model dtype before the product (the
    norm's scale is applied to the dot product's float32 result), so in bf16 the result differs from
    `gemv(rmsnorm(...))` by that rounding."""
    n, k = weight.shape
    if x.dim() != 2 or x.shape[0] != 1 or x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("gemv takes one row [1, K], contiguous in the last dim")
    (b, r, r_out, nw), flags = _linear_variant(
        "gemv", "[1, K]", x, weight, bias, silu_mul, norm_weight, residual, residual_out
    )
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    launch = _pdl(pdl, x.device)
    kernel, meta = (_gemv if extra_tiles else _gemv_base), _FIXED
    if tuned and extra_tiles:
        config = _tuned_config("gemv", x, n, k, flags, launch["USE_PDL"])
        if config is not None:
            kernel, meta = _gemv_kernel, config
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
        x,
        weight,
        b,
        y,
        r,
        r_out,
        nw,
        n,
        k,
        weight.stride(0),
        eps,
        **flags,
        **launch,
        **meta,
    )
    return y


# ---------------------------------------------------------------------------------------------------------
# Few-row linear layers (GEMV over M = 2..8 rows). A step of 2-8 tokens (a bs-1 extend of 2-8 new tokens,
# a decode of 2-8 rows) under cuBLAS reads its small weights at about 1 TB/s (too few CTAs for a few rows);
# a `tl.dot` GEMM for these rows lost to cuBLAS (run B). This kernel is the one-row GEMV with every
# program keeping all M rows: it reads each weight tile once and accumulates M dot products from it with
# float32 FMAs (no tensor cores), so the step stays bound by one read of the weights, and it loads the
# activations once per K tile for all rows. Every tensor is a K tile viewed as [.., BLOCK_K // 8, 8] (one
# thread's 16-byte load in the last dim, the threads along the middle one: BLOCK_K = 256 * num_warps, so no
# row or column is split over threads): the weights [BLOCK_N, BLOCK_K // 8, 8] as in `gemv`, the
# activations [BLOCK_M, BLOCK_K // 8, 8] loaded (and SiLU * up / add & RMSNorm applied) once for all rows.
# Row m is picked from them in registers (a masked sum with -0.0, which folds away) and multiplied into its
# own accumulator [BLOCK_N, BLOCK_K // 8] (one float32 per column and thread: the 8 products of a 16-byte
# vector are summed at once), so per weight vector a thread issues about M * 12 FP ops and no other loads.
# Rows are unrolled up to 8 (accumulators acc0..acc7: Triton has no arrays of tensors). Same input variants
# as `gemv`. Compiled for sm_90 with Triton 3.6 and 3.9 (their ptxas, launch-time divisibility): 64-255
# registers, no spills, for every config and variant below; a K tile at 8 rows is ~400 instructions (before
# the 2-D loads below, Triton 3.6 made it ~4200, see there).
# A first kernel that loaded the activations per output column ([BLOCK_M, BLOCK_N, BLOCK_K]) was removed:
# on the H200 it was slower in 38 of 40 kernel cases (up to 4x) and every model step (docs/benchmarks.md,
# "Run E").
# ---------------------------------------------------------------------------------------------------------

GEMV_ROWS_LIMIT = 8  # the most rows `gemv_rows` takes (BLOCK_M 2, 4, 8)
_GEMV_FEW_TILES = {  # BLOCK_M -> (BLOCK_N, BLOCK_K, warps, stages); BLOCK_K = 256 * warps (see above)
    2: [
        (8, 1024, 4, 1),
        (16, 1024, 4, 1),
        (4, 1024, 4, 1),
        (8, 2048, 8, 1),
        (16, 512, 2, 1),
        (4, 2048, 8, 1),
    ],
    4: [(4, 1024, 4, 1), (8, 1024, 4, 1), (2, 1024, 4, 1), (4, 2048, 8, 1), (8, 512, 2, 1), (2, 2048, 8, 1)],
    8: [(2, 1024, 4, 1), (4, 1024, 4, 1), (1, 1024, 4, 1), (2, 2048, 8, 1), (4, 512, 2, 1), (1, 2048, 8, 1)],
}
_GEMV_FEW_CONFIGS = {bm: _tile_configs(tiles) for bm, tiles in _GEMV_FEW_TILES.items()}


@triton.jit
def _gemv_few_kernel(
    X,
    W,
    Bias,
    Y,
    R,
    R_out,
    NW,
    M,
    N,
    K,
    stride_x,
    stride_wn,
    eps,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,  # row m of X is [gate | up] of width 2K: its input is SiLU(gate) * up
    NORM: tl.constexpr,  # row m's input is RMSNorm(h_m) * NW, h = X (+ R when HAS_RES)
    HAS_RES: tl.constexpr,  # h = X + R ([M, K] contiguous), and program 0 writes h to R_out
    BLOCK_M: tl.constexpr,  # 2, 4 or 8 (M rounded up to a power of two)
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    VEC: tl.constexpr = 8
    KV: tl.constexpr = BLOCK_K // VEC
    pid = tl.program_id(0)
    # Memory is accessed as 2-D [rows * KV, VEC] tiles (entry j: row j // KV, vector j % KV of the K tile),
    # viewed as [rows, KV, VEC] in registers (`tl.reshape`, no data movement). Their only contiguous dim is
    # the last, so every Triton version gives a thread VEC elements and spreads the threads along KV. Loaded
    # as 3-D [rows, KV, VEC], two dims tie on contiguity, and Triton 3.6 (the H200's) breaks the tie the
    # other way: threads across the rows / columns, so each row's pick below became a shuffle reduction and
    # a shared-memory layout conversion (sm_90 SASS of a K tile at 8 rows: ~4200 instructions and ~30
    # block barriers, against ~400 instructions and none in the layout written for).
    jn = tl.arange(0, BLOCK_N * KV)[:, None]
    jm = tl.arange(0, BLOCK_M * KV)[:, None]
    vec = tl.arange(0, VEC)[None, :]
    kn = (jn % KV) * VEC + vec  # the K offsets of a weight tile [BLOCK_N * KV, VEC]
    km = (jm % KV) * VEC + vec  # and of an activation tile [BLOCK_M * KV, VEC]
    cols = pid * BLOCK_N + jn // KV
    n_ok = cols < N
    w_ptrs = W + cols.to(tl.int64) * stride_wn + kn
    row_of = jm // KV
    m_ok = row_of < M
    x_ptrs = X + row_of.to(tl.int64) * stride_x + km
    r_offs = row_of.to(tl.int64) * K + km  # R / R_out are [M, K] contiguous
    k_nw = tl.arange(0, KV)[:, None] * VEC + vec  # the norm weights of a K tile [KV, VEC]
    rows = tl.arange(0, BLOCK_M)[:, None, None]
    # as in `_gemv_kernel`: the first weight tile is read before the PDL wait, each next one after the
    # current tile's math; the norm in the same pass (per row: rstd_m factors out of row m's dot products)
    w = tl.reshape(tl.load(w_ptrs, mask=n_ok & (kn < K), other=0.0), [BLOCK_N, KV, VEC])
    if USE_PDL:  # wait for the kernel before, then let the next one start
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    ss = tl.zeros([BLOCK_M, KV], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_N, KV], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, KV], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, KV], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, KV], dtype=tl.float32)
    acc4 = tl.zeros([BLOCK_N, KV], dtype=tl.float32)
    acc5 = tl.zeros([BLOCK_N, KV], dtype=tl.float32)
    acc6 = tl.zeros([BLOCK_N, KV], dtype=tl.float32)
    acc7 = tl.zeros([BLOCK_N, KV], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mk_ok = m_ok & (k0 + km < K)
        x = tl.load(x_ptrs + k0, mask=mk_ok, other=0.0).to(tl.float32)  # every row, once
        if SILU_MUL:
            up = tl.load(x_ptrs + K + k0, mask=mk_ok, other=0.0).to(tl.float32)
            x = (x / (1.0 + tl.exp(-x)) * up).to(W.dtype.element_ty).to(tl.float32)
        if NORM:
            if HAS_RES:  # h = x + residual, kept in the model dtype (as `rmsnorm` stores it)
                r = tl.load(R + r_offs + k0, mask=mk_ok, other=0.0).to(tl.float32)
                h = (x + r).to(R_out.dtype.element_ty)
                if pid == 0:
                    tl.store(R_out + r_offs + k0, h, mask=mk_ok)
                x = h.to(tl.float32)
        x = tl.reshape(x, [BLOCK_M, KV, VEC])
        if NORM:
            ss += tl.sum(x * x, 2)
            nw = tl.load(NW + k0 + k_nw, mask=k0 + k_nw < K, other=0.0).to(tl.float32)
            x = x * tl.reshape(nw, [1, KV, VEC])
        wf = w.to(tl.float32)
        # row m: its [1, BLOCK_K // VEC, VEC] slice of x (the rows are in each thread's registers)
        acc0 += tl.sum(wf * tl.sum(tl.where(rows == 0, x, -0.0), 0, keep_dims=True), 2)
        acc1 += tl.sum(wf * tl.sum(tl.where(rows == 1, x, -0.0), 0, keep_dims=True), 2)
        if BLOCK_M > 2:
            acc2 += tl.sum(wf * tl.sum(tl.where(rows == 2, x, -0.0), 0, keep_dims=True), 2)
            acc3 += tl.sum(wf * tl.sum(tl.where(rows == 3, x, -0.0), 0, keep_dims=True), 2)
        if BLOCK_M > 4:
            acc4 += tl.sum(wf * tl.sum(tl.where(rows == 4, x, -0.0), 0, keep_dims=True), 2)
            acc5 += tl.sum(wf * tl.sum(tl.where(rows == 5, x, -0.0), 0, keep_dims=True), 2)
            acc6 += tl.sum(wf * tl.sum(tl.where(rows == 6, x, -0.0), 0, keep_dims=True), 2)
            acc7 += tl.sum(wf * tl.sum(tl.where(rows == 7, x, -0.0), 0, keep_dims=True), 2)
        nxt = k0 + BLOCK_K  # the last iteration's load is fully masked: no memory traffic
        w = tl.reshape(tl.load(w_ptrs + nxt, mask=n_ok & (nxt + kn < K), other=0.0), [BLOCK_N, KV, VEC])
    # [BLOCK_M, BLOCK_N] from the per-row sums (once per program)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rows2 = tl.arange(0, BLOCK_M)[:, None]
    out = tl.where(rows2 == 0, tl.sum(acc0, 1)[None, :], 0.0)
    out = tl.where(rows2 == 1, tl.sum(acc1, 1)[None, :], out)
    if BLOCK_M > 2:
        out = tl.where(rows2 == 2, tl.sum(acc2, 1)[None, :], out)
        out = tl.where(rows2 == 3, tl.sum(acc3, 1)[None, :], out)
    if BLOCK_M > 4:
        out = tl.where(rows2 == 4, tl.sum(acc4, 1)[None, :], out)
        out = tl.where(rows2 == 5, tl.sum(acc5, 1)[None, :], out)
        out = tl.where(rows2 == 6, tl.sum(acc6, 1)[None, :], out)
        out = tl.where(rows2 == 7, tl.sum(acc7, 1)[None, :], out)
    if NORM:
        out = out * tl.rsqrt(tl.sum(ss, 1) / K + eps)[:, None]
    if HAS_BIAS:
        out += tl.load(Bias + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    y_ptrs = Y + rows2.to(tl.int64) * N + offs_n[None, :]
    tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=(rows2 < M) & (offs_n < N)[None, :])


if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter cannot autotune: one fixed config
    _gemv_few = dict.fromkeys(_GEMV_FEW_CONFIGS, _gemv_few_kernel)
    _FIXED_FEW = {"BLOCK_N": 4, "BLOCK_K": 64}
else:  # one autotuner per BLOCK_M, keyed like the GEMV's (a tuned tile table's key adds BLOCK_M)
    _gemv_few = {bm: _autotune(cfgs, GEMV_KEY)(_gemv_few_kernel) for bm, cfgs in _GEMV_FEW_CONFIGS.items()}
    _FIXED_FEW = {}


def gemv_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu_mul: bool = False,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    pdl: bool = False,
    tuned: bool = False,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a few rows x [M, K] -> [M, N], 2 <= M <= GEMV_ROWS_LIMIT (8):
    `_gemv_few_kernel`, `gemv` with every program keeping all M rows (each weight tile read once, the
    activations once per K tile, M float32 FMAs per weight element). Autotuned per (M rounded up to a
    power of two, N, K, variant) on first use, so run it once before a CUDA graph capture. The input
    variants (`silu_mul`, `norm_weight`, `residual` / `residual_out`, all per row) and `pdl` are `gemv`'s;
    residual and residual_out are [M, K]. With `tuned`, a config measured fastest inside the CUDA graph step
    for this GPU model, dtype and tuning key (`gemv`'s and BLOCK_M; `tuned_tiles.lookup`) replaces the
    autotuner's choice where the tables have one."""
    n, k = weight.shape
    if x.dim() != 2 or not 2 <= x.shape[0] <= GEMV_ROWS_LIMIT or x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"gemv_rows takes 2-{GEMV_ROWS_LIMIT} rows [M, K], contiguous in the last dim")
    m = x.shape[0]
    (b, r, r_out, nw), flags = _linear_variant(
        "gemv_rows", "[M, K]", x, weight, bias, silu_mul, norm_weight, residual, residual_out
    )
    block_m = max(2, triton.next_power_of_2(m))
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    launch = _pdl(pdl, x.device)
    kernel, meta = _gemv_few[block_m], _FIXED_FEW
    if tuned:
        config = _tuned_config("gemv_rows", x, n, k, flags, launch["USE_PDL"], BLOCK_M=block_m)
        if config is not None:
            kernel, meta = _gemv_few_kernel, config
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
        x,
        weight,
        b,
        y,
        r,
        r_out,
        nw,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        eps,
        **flags,
        BLOCK_M=block_m,
        **launch,
        **meta,
    )
    return y


# ---------------------------------------------------------------------------------------------------------
# Few-row linear layers on tensor cores (M = 1..32 rows), "swap AB". `gemv_rows` above spends M float32
# FMAs per weight element, which past ~4 rows makes a step compute-bound (the 0.6B's one-request extends of
# 8 tokens: 1.6x a decode, docs/benchmarks.md, run F), and the earlier `tl.dot` kernel (run B, removed) put
# the few rows on the MMA's M side with 4-32 weight rows per program, below the tensor cores' tile shapes.
# Here the weight is the MMA's M side: a program multiplies BLOCK_W weight rows (output columns) by the
# activations transposed, [BLOCK_W, BLOCK_K] x [BLOCK_K, BLOCK_X] -> [BLOCK_W, BLOCK_X] with BLOCK_X 16 (up to
# 16 rows) or 32 (17-32 rows; rows past M masked to zero),
# so the tensor cores do the FMAs and the program's cost is its weight bytes. Layers with few output
# columns (the 0.6B's o_proj and down_proj: N = 1024) split K over SPLIT_K programs per column block for
# more bytes in flight; the split programs store float32 partials [SPLIT_K, BLOCK_X, N] and the last one of a
# block to finish (an atomic ticket, as in the attention's fused merge) sums them in split order (the
# result does not depend on which program finishes last) and writes Y, leaving its ticket zero for the next
# launch. SiLU(gate) * up is applied in the activation load (down_proj), rounded to the weight dtype as
# `silu_and_mul` stores it, and add & RMSNorm (`gemv_norm`) as in `gemv_rows`: each row's sum of squares is
# summed with its dots (per split, merged with the partials) and its rstd scales the result.
# ---------------------------------------------------------------------------------------------------------

# the autotuner's key (and a tuned tile table's, `tuned_tiles`): the layer's shape, the variant, the rows' block
DOT_ROWS_KEY = ["N", "K", "SILU_MUL", "NORM", "HAS_RES", "USE_PDL", "PREFETCH_W", "BLOCK_X"]
DOT_ROWS_LIMIT = 32  # the most rows `dot_rows` takes (the MMA's N side: BLOCK_X 16 up to 16 rows, else 32)
_DOT_ROWS_TILES = [  # (BLOCK_W, BLOCK_K, SPLIT_K, warps, stages); each timed alone in run H (docs/raw/run-h)
    (32, 128, 1, 4, 4),
    (64, 128, 1, 4, 4),
    (64, 64, 1, 4, 6),
    (128, 64, 1, 4, 4),
    (16, 256, 1, 4, 3),
    (32, 128, 2, 4, 4),
    (64, 128, 2, 4, 4),
    (32, 128, 4, 4, 3),
    (64, 64, 4, 4, 4),
    (16, 128, 4, 4, 4),
    (32, 64, 8, 4, 4),
]
# With PREFETCH_W (the engine's `dot_prefetch`, on by default) the autotuner tries these instead: one K tile
# per program (cdiv(K, SPLIT_K) <= BLOCK_K, for the small models' K of 1024, 2048 and 3072), so that a program
# reads its whole weight slice before the PDL wait, as the one-token GEMV does with its 1024-wide tiles. Run J
# (docs/benchmarks.md): 0.82-0.96x the step time of the tiles above, at every 0.6B dot_rows step.
_DOT_ROWS_ONE_TILE = [
    (32, 128, 8, 4, 1),
    (16, 256, 4, 4, 1),
    (32, 256, 4, 4, 1),
    (16, 256, 8, 4, 1),
    (32, 256, 8, 4, 1),
    (16, 256, 12, 4, 1),
    (32, 256, 12, 4, 1),
    # K 1024 (q/k/v and gate/up of the 0.6B) in one or two splits: no split-K ticket and reload, or one
    # partner; 64 KB / 32-48 KB of shared memory per program (sm_90 build). Added after run J, unmeasured.
    (16, 1024, 1, 8, 1),
    (16, 512, 2, 4, 1),
    (32, 512, 2, 8, 1),
]


def _dot_configs(tiles) -> list:
    return [
        triton.Config({"BLOCK_W": bw, "BLOCK_K": bk, "SPLIT_K": sk}, num_warps=w, num_stages=s)
        for bw, bk, sk, w, s in tiles
    ]


_DOT_ROWS_CONFIGS = _dot_configs(_DOT_ROWS_TILES)
_DOT_ROWS_ONE_TILE_CONFIGS = _dot_configs(_DOT_ROWS_ONE_TILE)
_DOT_ROWS_MAX_SPLIT = max(t[2] for t in _DOT_ROWS_TILES + _DOT_ROWS_ONE_TILE)


def _dot_rows_prune(configs, named_args, **kwargs) -> list:
    """The autotuner's candidates: `_DOT_ROWS_CONFIGS`, or with PREFETCH_W the one-tile configs that cover
    this K in one tile (all of them where none does)."""
    if not kwargs.get("PREFETCH_W"):
        return _DOT_ROWS_CONFIGS
    k = named_args["K"]
    one = [
        c for c in _DOT_ROWS_ONE_TILE_CONFIGS if triton.cdiv(k, c.kwargs["SPLIT_K"]) <= c.kwargs["BLOCK_K"]
    ]
    return one or _DOT_ROWS_ONE_TILE_CONFIGS


@triton.jit
def _dot_rows_tile(acc, ss, w, W, x_ptrs, R, R_out, NW, r_offs, k0, kk, k_hi, x_ok, K, pid_n,
                   SILU_MUL: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr,
                   DOT_F32: tl.constexpr):  # fmt: skip
    """One K tile of `_dot_rows_kernel`: the rows' inputs at [k0, k0 + BLOCK_K) (SiLU * up, add & RMSNorm
    as its flags say) times the weight tile `w`, added to acc; NORM: the tile's squares added to ss."""
    k_ok = k0 + kk < k_hi
    xk_ok = k_ok[:, None] & x_ok[None, :]
    x = tl.load(x_ptrs + k0, mask=xk_ok, other=0.0)
    if SILU_MUL:
        g = x.to(tl.float32)
        up = tl.load(x_ptrs + K + k0, mask=xk_ok, other=0.0).to(tl.float32)
        x = (g / (1.0 + tl.exp(-g)) * up).to(W.dtype.element_ty)
    if NORM:
        # as in `gemv_rows`: rstd_m factors out of row m's dot products, so the squares are summed
        # here and the scale applied to the result; the MMA takes h * NW in the weight dtype
        if HAS_RES:  # h = x + residual, kept in the model dtype (as `rmsnorm` stores it)
            r = tl.load(R + r_offs + k0, mask=xk_ok, other=0.0).to(tl.float32)
            x = (x.to(tl.float32) + r).to(R_out.dtype.element_ty)
            if pid_n == 0:
                tl.store(R_out + r_offs + k0, x, mask=xk_ok)
        hf = x.to(tl.float32)
        ss += tl.sum(hf * hf, 0)
        nw = tl.load(NW + k0 + kk, mask=k_ok, other=0.0).to(tl.float32)
        x = (hf * nw[:, None]).to(W.dtype.element_ty)
    if DOT_F32:
        acc += tl.dot(w.to(tl.float32), x.to(tl.float32), input_precision="ieee")
    elif W.dtype.element_ty == tl.float32:  # exact products for float32 models (no TF32)
        acc += tl.dot(w, x.to(tl.float32), input_precision="ieee")
    else:
        acc += tl.dot(w, x.to(W.dtype.element_ty))
    return acc, ss


@triton.jit
def _dot_rows_kernel(
    X,
    W,
    Bias,
    Y,
    Part,  # float32 [SPLIT_K, BLOCK_X, N] partials (SPLIT_K > 1)
    SS,  # float32 [column blocks, SPLIT_K, BLOCK_X] partial sums of squares (NORM and SPLIT_K > 1)
    Tickets,  # int32, one per column block, zero between launches (SPLIT_K > 1)
    R,
    R_out,
    NW,
    M,
    N,
    K,
    stride_x,
    stride_wn,
    eps,
    Trace,  # int64 [programs, 4] per launch from trace_at (TRACE; `DotTrace`)
    trace_at,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,  # row m of X is [gate | up] of width 2K: its input is SiLU(gate) * up
    NORM: tl.constexpr,  # row m's input is RMSNorm(h_m) * NW, h = X (+ R when HAS_RES)
    HAS_RES: tl.constexpr,  # h = X + R ([M, K] contiguous); the programs of column block 0 write h to R_out
    BLOCK_W: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_X: tl.constexpr = 16,  # the rows' block (the MMA's N): 16, or 32 for 17-32 rows
    USE_PDL: tl.constexpr = False,
    PREFETCH_W: tl.constexpr = False,  # read the first weight tile before waiting on the previous kernel
    DOT_F32: tl.constexpr = False,  # float32 dots for every dtype (the interpreter: its bf16 dot is wrong)
    TRACE: tl.constexpr = False,  # record the program's timeline (a diagnostic; GPU only)
    UNROLL_MERGE: tl.constexpr = False,  # the split merge's loop unrolled (`dot_rows(unroll_merge=True)`)
):
    if TRACE:
        t_start = tl.extra.cuda.globaltimer()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_w = pid_n * BLOCK_W + tl.arange(0, BLOCK_W)
    offs_x = tl.arange(0, BLOCK_X)
    w_ok = offs_w < N
    x_ok = offs_x < M
    kk = tl.arange(0, BLOCK_K)
    span = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K  # this split's K range: [k_lo, k_hi)
    k_lo = pid_k * span
    k_hi = tl.minimum(k_lo + span, K)
    w_ptrs = W + offs_w.to(tl.int64)[:, None] * stride_wn + kk[None, :]
    x_ptrs = X + offs_x.to(tl.int64)[None, :] * stride_x + kk[:, None]  # [BLOCK_K, BLOCK_X]: X transposed
    r_offs = offs_x.to(tl.int64)[None, :] * K + kk[:, None]  # R / R_out are [M, K] contiguous
    # the first K tile is peeled off the loop: with PREFETCH_W its weights are read before waiting on the
    # previous kernel (PDL; weights are never written), as the GEMV does
    w_first_ok = w_ok[:, None] & (k_lo + kk < k_hi)[None, :]
    if PREFETCH_W:
        w = tl.load(w_ptrs + k_lo, mask=w_first_ok, other=0.0)
    if USE_PDL:  # wait for the kernel before, then let the next one start
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if TRACE:
        t_waited = tl.extra.cuda.globaltimer()
    if not PREFETCH_W:
        w = tl.load(w_ptrs + k_lo, mask=w_first_ok, other=0.0)
    acc = tl.zeros([BLOCK_W, BLOCK_X], dtype=tl.float32)
    ss = tl.zeros([BLOCK_X], dtype=tl.float32)  # NORM: this split's sum of squares per row
    acc, ss = _dot_rows_tile(acc, ss, w, W, x_ptrs, R, R_out, NW, r_offs, k_lo, kk, k_hi, x_ok, K, pid_n,
                             SILU_MUL, NORM, HAS_RES, DOT_F32)  # fmt: skip
    for k0 in tl.range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        w = tl.load(w_ptrs + k0, mask=w_ok[:, None] & (k0 + kk < k_hi)[None, :], other=0.0)
        acc, ss = _dot_rows_tile(acc, ss, w, W, x_ptrs, R, R_out, NW, r_offs, k0, kk, k_hi, x_ok, K, pid_n,
                                 SILU_MUL, NORM, HAS_RES, DOT_F32)  # fmt: skip
    y_ptrs = Y + offs_x.to(tl.int64)[None, :] * N + offs_w[:, None]  # Y [M, N] written transposed
    y_ok = w_ok[:, None] & x_ok[None, :]
    if SPLIT_K == 1:
        out = acc
        if NORM:
            out = out * tl.rsqrt(ss / K + eps)[None, :]
        if HAS_BIAS:
            out += tl.load(Bias + offs_w, mask=w_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=y_ok)
    else:
        p_ptrs = Part + offs_x.to(tl.int64)[None, :] * N + offs_w[:, None]
        tl.store(p_ptrs + pid_k * BLOCK_X * N, acc, mask=y_ok)
        ss_ptrs = SS + (pid_n * SPLIT_K) * BLOCK_X + offs_x
        if NORM:
            tl.store(ss_ptrs + pid_k * BLOCK_X, ss)
        # every thread's partial stored before one thread takes the ticket (release, GPU scope); the last
        # split of the block sees all of them (acquire)
        tl.debug_barrier()
        ticket = tl.atomic_add(Tickets + pid_n, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            tl.atomic_xchg(Tickets + pid_n, 0, sem="relaxed", scope="gpu")  # zero for the next launch
            out = tl.zeros([BLOCK_W, BLOCK_X], dtype=tl.float32)
            total = tl.zeros([BLOCK_X], dtype=tl.float32)
            # in split order: the same sum whichever program came last. UNROLL_MERGE unrolls the loop, so
            # that the partials' loads are issued together (one L2 round trip, not SPLIT_K: Triton 3.6 leaves
            # the loop rolled where its body is large, e.g. the down projection's 12 splits); the same sum
            if UNROLL_MERGE:
                for s in tl.static_range(SPLIT_K):
                    out += tl.load(p_ptrs + s * BLOCK_X * N, mask=y_ok, other=0.0, cache_modifier=".cg")
                    if NORM:
                        total += tl.load(ss_ptrs + s * BLOCK_X, cache_modifier=".cg")
            else:
                for s in range(SPLIT_K):
                    out += tl.load(p_ptrs + s * BLOCK_X * N, mask=y_ok, other=0.0, cache_modifier=".cg")
                    if NORM:
                        total += tl.load(ss_ptrs + s * BLOCK_X, cache_modifier=".cg")
            if NORM:
                out = out * tl.rsqrt(total / K + eps)[None, :]
            if HAS_BIAS:
                out += tl.load(Bias + offs_w, mask=w_ok, other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=y_ok)
    if TRACE:  # start, PDL wait over, end (global timer, ns), SM
        t_end = tl.extra.cuda.globaltimer()
        at = Trace + (trace_at + pid_k * tl.num_programs(0) + pid_n).to(tl.int64) * 4
        tl.store(at, t_start)
        tl.store(at + 1, t_waited)
        tl.store(at + 2, t_end)
        tl.store(at + 3, tl.extra.cuda.smid().to(tl.int64))


if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter cannot autotune: one fixed config
    _dot_rows = _dot_rows_kernel
    # Triton's interpreter (3.9 here) multiplies bf16 tiles in tl.dot as garbage (errors of 1e11 seen), so
    # its dots run in float32 on the bf16 values (the GPU's tensor cores also sum bf16 products in float32)
    _FIXED_DOT = {"BLOCK_W": 16, "BLOCK_K": 32, "SPLIT_K": 2, "DOT_F32": True}
else:
    _dot_rows = _autotune(
        _DOT_ROWS_CONFIGS + _DOT_ROWS_ONE_TILE_CONFIGS,
        DOT_ROWS_KEY,
        prune_configs_by={"early_config_prune": _dot_rows_prune},
    )(_dot_rows_kernel)
    _FIXED_DOT = {}

# per device: the split partials and tickets, grown as needed; kernels on one stream use them one after
# another (each launch finishes its sums and zeroes its tickets before the next starts), and a buffer that
# was replaced stays alive, since CUDA graphs captured with it still use it
_dot_rows_scratch: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}


def _dot_scratch(device: torch.device, n: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(partials, tickets) for an N-wide layer and a `rows`-row block: float32 [2 * max split * rows * N] (the
    dot partials, then the sums of squares, one set per column block: at most N blocks), int32 [N] (zero). The
    32-row block's larger buffer is made the first time a 17-32 row step runs."""
    bufs = _dot_rows_scratch.setdefault(device, [])
    need = 2 * _DOT_ROWS_MAX_SPLIT * rows * n
    if not bufs or bufs[-1][0].numel() < need or bufs[-1][1].numel() < n:
        size = max(need, 2 * _DOT_ROWS_MAX_SPLIT * rows * 8192)
        bufs.append(
            (
                torch.empty(size, dtype=torch.float32, device=device),
                torch.zeros(max(n, 8192), dtype=torch.int32, device=device),
            )
        )
    return bufs[-1]


class DotTrace:
    """A timeline of `dot_rows` launches, to see where programmatic dependent launch overlaps kernels
    (Nsight Systems does not run on the GPU machine). While one is active (`with
    DotTrace(device) as trace:`), every `dot_rows` launch on `device` reserves rows of `buf` and each of its
    programs writes there the GPU's global timer (ns) when it starts, when its PDL wait returns (at once
    without PDL) and when it ends, and its SM; a launch captured in a CUDA graph writes at every replay.
    `launches` holds, in launch order, each launch's rows (`at`, `programs` at most) and what it ran."""

    active: DotTrace | None = None

    def __init__(self, device: torch.device, capacity: int = 1 << 22) -> None:
        if torch.device(device).type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
            raise ValueError("DotTrace reads the GPU's timer: CUDA only, not under the interpreter")
        self.buf = torch.zeros((capacity, 4), dtype=torch.int64, device=device)
        self.used = 0
        self.launches: list[dict] = []

    def __enter__(self) -> DotTrace:
        DotTrace.active = self
        return self

    def __exit__(self, *exc) -> None:
        DotTrace.active = None

    def reserve(self, programs: int, **info) -> int:
        """Rows for a launch of at most `programs` programs; returns the first."""
        if self.used + programs > self.buf.shape[0]:
            raise RuntimeError(
                f"DotTrace: more than {self.buf.shape[0]} programs traced; give a larger capacity"
            )
        at = self.used
        self.used += programs
        self.launches.append(dict(at=at, programs=programs, **info))
        return at

    def clear(self) -> None:
        self.buf.zero_()

    def read(self) -> list[dict]:
        """The launches that ran since `clear`, in launch order, each with `timeline`: [start, waited, end,
        sm] per program that ran."""
        data = self.buf[: self.used].cpu()
        out = []
        for launch in self.launches:
            rows = data[launch["at"] : launch["at"] + launch["programs"]]
            rows = rows[rows[:, 0] != 0]
            if len(rows):
                out.append(dict(launch, timeline=rows.tolist()))
        return out


def check_tile_config(kernel: str, config: dict) -> None:
    """ValueError unless `config` is a launchable `kernel` config from a tuned tile table (`tuned_tiles`): the
    engine reads them for `dot_rows`, with BLOCK_W and BLOCK_K powers of two from 16, SPLIT_K 1 to the
    scratch buffers' limit, num_warps a power of two up to 16, num_stages >= 1 and, if given, maxnreg (the
    most registers per thread) 32 to 255; for `gemv` and `gemv_rows`, with BLOCK_N a power of two up to 128
    and BLOCK_K one from 16 to 4096 (`gemv_rows`: 256 per warp, its load layout), the same warps and
    stages."""
    if kernel in ("gemv", "gemv_rows"):
        want = {"BLOCK_N", "BLOCK_K", "num_warps", "num_stages"}
        if set(config) != want:
            raise ValueError(f"expected the parameters {sorted(want)}, got {sorted(config)}")
        bn, bk = config["BLOCK_N"], config["BLOCK_K"]
        if not (1 <= bn <= 128 and 16 <= bk <= 4096) or bn & (bn - 1) or bk & (bk - 1):
            raise ValueError(f"BLOCK_N {bn}, BLOCK_K {bk}: powers of two, 1-128 and 16-4096")
        if config["num_warps"] not in (1, 2, 4, 8, 16) or config["num_stages"] < 1:
            raise ValueError("num_warps must be 1, 2, 4, 8 or 16 and num_stages at least 1")
        if kernel == "gemv_rows" and bk != 256 * config["num_warps"]:
            raise ValueError(
                f"BLOCK_K {bk}: gemv_rows loads 256 columns per warp (BLOCK_K = 256 * num_warps)"
            )
        return
    if kernel != "dot_rows":
        raise ValueError(
            f"the engine reads tuned tiles for dot_rows, gemv and gemv_rows only, not {kernel!r}"
        )
    want = {"BLOCK_W", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages"}
    if set(config) - {"maxnreg"} != want:
        raise ValueError(f"expected the parameters {sorted(want)} (and maxnreg), got {sorted(config)}")
    reg = config.get("maxnreg")
    if reg is not None and (not isinstance(reg, int) or not 32 <= reg <= 255):
        raise ValueError(f"maxnreg {reg!r}: expected 32 to 255")
    pow2 = {c: v for c, v in config.items() if c in ("BLOCK_W", "BLOCK_K") and (v < 16 or v & (v - 1))}
    if pow2:
        raise ValueError(f"{pow2}: BLOCK_W and BLOCK_K must be powers of two, at least 16")
    if not 1 <= config["SPLIT_K"] <= _DOT_ROWS_MAX_SPLIT:
        raise ValueError(f"SPLIT_K {config['SPLIT_K']}: expected 1 to {_DOT_ROWS_MAX_SPLIT}")
    if config["num_warps"] not in (1, 2, 4, 8, 16) or config["num_stages"] < 1:
        raise ValueError("num_warps must be 1, 2, 4, 8 or 16 and num_stages at least 1")


def dot_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu_mul: bool = False,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    pdl: bool = False,
    prefetch: bool = False,
    config: dict | None = None,
    tuned: bool = False,
    unroll_merge: bool = False,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a few rows x [M, K] -> [M, N], 1 <= M <= DOT_ROWS_LIMIT (32), on tensor
    cores (`_dot_rows_kernel`: the weight on the MMA's large side, split K for narrow layers). Autotuned per
    (N, K, variant) on first use, so run it once before a CUDA graph capture; `config` ({"BLOCK_W",
    "BLOCK_K", "SPLIT_K", "num_warps", "num_stages"}) runs one tile config instead (tests, benchmarks).

    The input variants are `gemv_rows`' (per row; residual and residual_out [M, K]): `silu_mul` (x is [M, 2K]
    = [gate | up], the input SiLU(gate) * up), `norm_weight` (the input is `rmsnorm(h)` of h = x, or with
    `residual` h = x + residual, also written to `residual_out`). The normed row enters the MMA as h * NW in
    the weight dtype and rstd scales the float32 result (`rmsnorm` rounds h * rstd * NW instead). With `pdl`
    (see `_pdl`) and `prefetch`, each program reads its first weight tile before waiting on the kernel before.
    With `tuned`, a config measured fastest inside the CUDA graph step for this GPU model, dtype and tuning
    key (`tuned_tiles.lookup`) replaces the autotuner's choice where the tables have one. `unroll_merge`
    unrolls the split-K merge's loop (the partials loaded together; the same result, bit for bit).
    """
    n, k = weight.shape
    if x.dim() != 2 or not 1 <= x.shape[0] <= DOT_ROWS_LIMIT or x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"dot_rows takes 1-{DOT_ROWS_LIMIT} rows [M, K], contiguous in the last dim")
    (b, r, r_out, nw), flags = _linear_variant(
        "dot_rows", "[M, K]", x, weight, bias, silu_mul, norm_weight, residual, residual_out
    )
    m = x.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_x = 16 if m <= 16 else 32
    part, tickets = _dot_scratch(x.device, n, block_x)
    launch = _pdl(pdl, x.device)
    prefetch_w = bool(prefetch and launch["USE_PDL"])
    ss = part[_DOT_ROWS_MAX_SPLIT * block_x * n :]
    if config is None and tuned:
        config = _tuned_config(
            "dot_rows", x, n, k, flags, launch["USE_PDL"], PREFETCH_W=prefetch_w, BLOCK_X=block_x
        )
    if config is not None:
        kernel, meta = _dot_rows_kernel, dict(config)
        if os.environ.get("TRITON_INTERPRET") == "1":
            meta["DOT_F32"] = True
        if meta.get("SPLIT_K", 1) > _DOT_ROWS_MAX_SPLIT:
            raise ValueError(f"dot_rows: SPLIT_K at most {_DOT_ROWS_MAX_SPLIT}")
    else:
        kernel, meta = _dot_rows, dict(_FIXED_DOT)
    trace = DotTrace.active
    tracing = trace is not None and trace.buf.device == x.device
    trace_at = 0
    if tracing:
        programs = triton.cdiv(n, meta.get("BLOCK_W", 16)) * meta.get("SPLIT_K", _DOT_ROWS_MAX_SPLIT)
        trace_at = trace.reserve(programs, n=n, k=k, rows=m, config=config)
    compiled = kernel[lambda cfg: (triton.cdiv(n, cfg["BLOCK_W"]), cfg["SPLIT_K"])](
        x,
        weight,
        b,
        y,
        part,
        ss,
        tickets,
        r,
        r_out,
        nw,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        eps,
        trace.buf if tracing else tickets,
        trace_at,
        **flags,
        **launch,
        PREFETCH_W=prefetch_w,
        BLOCK_X=block_x,
        TRACE=tracing,
        UNROLL_MERGE=unroll_merge,
        **meta,
    )
    if tracing:  # what limits how many of its programs fit on an SM
        trace.launches[-1].update(
            regs=compiled.n_regs, shared=compiled.metadata.shared, warps=compiled.metadata.num_warps
        )
    return y
