"""One- and few-row linear layers as Triton GEMVs (`gemv`, `gemv_rows`) and what every linear kernel
shares (`_linear_variant`, `_tuned_config`)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tokenrouter.runtime.engine.attention import tuned_tiles
from tokenrouter.runtime.engine.kernels.common import _autotune, _pdl, cdiv, next_pow2

# ---------------------------------------------------------------------------------------------------------
# One-row linear layers (GEMV). A batch-1 decode step multiplies one row by each weight matrix; cuBLAS runs
# these few-megabyte GEMVs far below the copy bandwidth (measured on the H200: 12.4 us for Qwen3-0.6B's
# 12.6 MB gate_up, about 1 TB/s). This kernel spreads the output columns over many programs, reads each
# weight tile once with wide contiguous loads, and can fuse SiLU(gate) * up into its input load
# (down_proj). Only for one row (`gemv_rows` below takes 2-8 rows, `dot_rows` at the end 1-16 on tensor
# cores; a tensor-core variant with the rows on the MMA's M side measured slower than cuBLAS).
# ---------------------------------------------------------------------------------------------------------

_GEMV_TILES_BASE = [  # the tile shapes of the kernel's first measured version
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
    _FIXED = {"BLOCK_N": 32, "BLOCK_K": 32}
else:
    _gemv = _autotune(_GEMV_CONFIGS, GEMV_KEY)(_gemv_kernel)
    _gemv_base = _autotune(_GEMV_CONFIGS_BASE, GEMV_KEY)(_gemv_kernel)
    _FIXED = {}


def _check_residual(fn, shape, x: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor) -> None:
    for t in (residual, residual_out):
        if t.shape != x.shape or not t.is_contiguous():
            raise ValueError(f"{fn}: residual and residual_out must be contiguous {shape} like x")
    if residual_out.data_ptr() == residual.data_ptr():
        raise ValueError(f"{fn}: residual_out must not be residual (other programs still read it)")


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
        _check_residual(fn, shape, x, residual, residual_out)
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
    of its first measured version only (for side-by-side timing); `pdl`: programmatic dependent launch where
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
    kernel[lambda meta: (cdiv(n, meta["BLOCK_N"]),)](
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
# a `tl.dot` GEMM for these rows lost to cuBLAS. This kernel is the one-row GEMV with every
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
# on the H200 it was slower in 38 of 40 kernel cases (up to 4x) and every model step.
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
    _FIXED_FEW = {"BLOCK_N": 16, "BLOCK_K": 64}
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
    block_m = max(2, next_pow2(m))
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    launch = _pdl(pdl, x.device)
    kernel, meta = _gemv_few[block_m], _FIXED_FEW
    if tuned:
        config = _tuned_config("gemv_rows", x, n, k, flags, launch["USE_PDL"], BLOCK_M=block_m)
        if config is not None:
            kernel, meta = _gemv_few_kernel, config
    kernel[lambda meta: (cdiv(n, meta["BLOCK_N"]),)](
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
