"""Few-row linear layers on tensor cores (`dot_rows`), their diagnostic timeline (`DotTrace`) and the check
of a tuned tile table's configs (`check_tile_config`)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tokenrouter.runtime.engine.kernels.common import _autotune, _pdl, cdiv
from tokenrouter.runtime.engine.kernels.linear import _linear_variant, _tuned_config

# ---------------------------------------------------------------------------------------------------------
# Few-row linear layers on tensor cores (M = 1..32 rows), "swap AB". `gemv_rows` above spends M float32
# FMAs per weight element, which past ~4 rows makes a step compute-bound (the 0.6B's one-request extends of
# 8 tokens: 1.6x a decode on the H200), and an earlier `tl.dot` kernel (removed) put
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
_DOT_ROWS_TILES = [  # (BLOCK_W, BLOCK_K, SPLIT_K, warps, stages); each timed alone on the H200
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
# reads its whole weight slice before the PDL wait, as the one-token GEMV does with its 1024-wide tiles. On the
# H200: 0.82-0.96x the step time of the tiles above, at every 0.6B dot_rows step.
_DOT_ROWS_ONE_TILE = [
    (32, 128, 8, 4, 1),
    (16, 256, 4, 4, 1),
    (32, 256, 4, 4, 1),
    (16, 256, 8, 4, 1),
    (32, 256, 8, 4, 1),
    (16, 256, 12, 4, 1),
    (32, 256, 12, 4, 1),
    # K 1024 (q/k/v and gate/up of the 0.6B) in one or two splits: no split-K ticket and reload, or one
    # partner; 64 KB / 32-48 KB of shared memory per program (sm_90 build). Added after that measurement,
    # not timed against the rest.
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
    one = [c for c in _DOT_ROWS_ONE_TILE_CONFIGS if cdiv(k, c.kwargs["SPLIT_K"]) <= c.kwargs["BLOCK_K"]]
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
    _FIXED_DOT = {"BLOCK_W": 32, "BLOCK_K": 32, "SPLIT_K": 2, "DOT_F32": True}
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
        _check_gemv_tiles(kernel, config)
    elif kernel == "dot_rows":
        _check_dot_rows_tiles(config)
    else:
        raise ValueError(
            f"the engine reads tuned tiles for dot_rows, gemv and gemv_rows only, not {kernel!r}"
        )


def _check_gemv_tiles(kernel: str, config: dict) -> None:
    want = {"BLOCK_N", "BLOCK_K", "num_warps", "num_stages"}
    if set(config) != want:
        raise ValueError(f"expected the parameters {sorted(want)}, got {sorted(config)}")
    bn, bk = config["BLOCK_N"], config["BLOCK_K"]
    if not (1 <= bn <= 128 and 16 <= bk <= 4096) or bn & (bn - 1) or bk & (bk - 1):
        raise ValueError(f"BLOCK_N {bn}, BLOCK_K {bk}: powers of two, 1-128 and 16-4096")
    if config["num_warps"] not in (1, 2, 4, 8, 16) or config["num_stages"] < 1:
        raise ValueError("num_warps must be 1, 2, 4, 8 or 16 and num_stages at least 1")
    if kernel == "gemv_rows" and bk != 256 * config["num_warps"]:
        raise ValueError(f"BLOCK_K {bk}: gemv_rows loads 256 columns per warp (BLOCK_K = 256 * num_warps)")


def _check_dot_rows_tiles(config: dict) -> None:
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
        programs = cdiv(n, meta.get("BLOCK_W", 16)) * meta.get("SPLIT_K", _DOT_ROWS_MAX_SPLIT)
        trace_at = trace.reserve(programs, n=n, k=k, rows=m, config=config)
    compiled = kernel[lambda cfg: (cdiv(n, cfg["BLOCK_W"]), cfg["SPLIT_K"])](
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
