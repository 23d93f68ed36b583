"""Fused element-wise Triton ops of the decoder: add & RMSNorm, q/k RMSNorm + rotary + the K/V store,
SiLU * up, the K/V store alone.

Fused element-wise ops. In a CUDA-graph decode step of a small model (0.6B: 28 layers) the time goes to
the number of kernels, not to bytes: eager RMSNorm alone is ~7 launches. These fold each group of
element-wise ops into one launch. All math is in float32; results are cast to the input dtype once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenrouter.runtime.engine.kernels.common import _pdl, cdiv, next_pow2


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
    _check_rmsnorm_layout(x, rows)
    n_rows, n_cols = x.shape if rows is None else (rows.shape[0], x.shape[1])
    if out is None:
        out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return out
    _launch_rmsnorm(x, weight, eps, residual, out, pdl, rows, n_rows)
    return out


def _check_rmsnorm_layout(x: torch.Tensor, rows: torch.Tensor | None) -> None:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError("rmsnorm needs a 2-D tensor contiguous in its last dim")
    if rows is not None and (rows.dim() != 1 or rows.stride(0) != 1):
        raise ValueError("rmsnorm: rows must be a contiguous 1-D index tensor")


def _launch_rmsnorm(x, weight, eps, residual, out, pdl, rows, n_rows) -> None:
    """`rmsnorm`'s kernel over `n_rows` rows (all of x's, or those `rows` picks), one program each."""
    n_cols = x.shape[1]
    block = next_pow2(n_cols)
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
        BLOCK_H=next_pow2(max(num_q_heads, num_kv_heads)),
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
    block = min(4096, next_pow2(n_cols))
    _silu_and_mul_kernel[(n_rows, cdiv(n_cols, block))](
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


def _check_per_token(
    k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor
) -> None:
    """ValueError unless k, v [T, row] and each token's slot of the buffers are contiguous."""
    if (
        k.stride(1) != 1
        or v.stride(1) != 1
        or not (k_buffer[0].is_contiguous() and v_buffer[0].is_contiguous())
    ):
        raise ValueError("store_kv needs k, v and the buffers contiguous per token")


def store_kv(
    k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor
) -> None:
    """k_buffer[loc] = k; v_buffer[loc] = v in one launch (k, v [T, kv_heads, head_dim])."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    k, v = k.reshape(num_tokens, -1), v.reshape(num_tokens, -1)
    _check_per_token(k, v, k_buffer, v_buffer)
    row = k.shape[1]
    block = min(1024, next_pow2(row))
    _store_kv_kernel[(num_tokens, cdiv(row, block))](
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
