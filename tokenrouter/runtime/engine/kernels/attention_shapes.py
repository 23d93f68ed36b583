"""The launch shape of paged attention (`attention.paged_attention`): query rows per program, KV splits,
pipeline stages and the fused split merge's rows and tickets. Each depends on the launch shape only (never
on sequence lengths), so a captured CUDA graph stays valid."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from tokenrouter.runtime.engine.kernels.common import cdiv, next_pow2

FUSED_MERGE_MAX_ROWS = 4  # `paged_attention(tickets=...)` merges in the kernel up to this many rows per block
# ... and (`merge_passes` P > 0) every larger row block whose merge takes at most P passes, one pass loading
# the partials of as many rows at once as FUSED_MERGE_TILE floats hold (64 registers per thread at 4 warps):
# a row block with few splits (many programs: bs 4 and more) merges its 8-16 rows in one pass, where the tail
# of the small blocks merges 2 rows per pass. 0.6B on the H200, side by side: one pass is
# 0.94-0.98x the step time of the merge launch (bs 4 x 4, 16 x 4, 16 x 8); two passes (bs 4 x 8: 16 rows at
# 8 splits) 1.03-1.07x, and one pass of twice this tile there 1.04-1.15x
FUSED_MERGE_TILE = 8192


def fused_merge_rows(block_rows: int, block_s: int, block_d: int, num_warps: int, passes: int) -> int:
    """Rows the fused merge loads per pass: 2, or (passes > 0) as many of the block's rows as the tile
    budget allows for `block_s` splits of `block_d` floats (a power of two, 2 to the block's rows)."""
    if passes <= 0:
        return 2
    fit = FUSED_MERGE_TILE * num_warps // 4 // (block_s * block_d)
    return max(2, min(next_pow2(block_rows), 1 << max(fit, 1).bit_length() - 1))


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
# unpipelined. From a sweep on the H200 (bs 16, ctx 4096, before PDL): decode rows fastest with 1 stage,
# 16-row blocks with 2, 32-row blocks with 3. The engine's backend picks per step kind instead
# (triton_backend.ATTN_DECODE_SINGLE_STAGE_BS: extends measured faster pipelined at every such block).
SINGLE_STAGE_ROWS = 8


def attention_stages(rows: int, block_m: int, single_stage_rows: int = SINGLE_STAGE_ROWS) -> int:
    """Pipeline stages of the attention's KV loop for `rows` query rows in blocks of `block_m`."""
    return 1 if rows <= single_stage_rows else (3 if block_m == 32 else 2)


# Split cap for decode-sized row blocks. A split's KV range is ceil(kv_len / splits) rounded up to the
# kernel's 64-token tile, so the splits that do work grow with the context (ctx 512: 8 busy programs per
# KV head, ctx 4096: 64) while the grid stays fixed for a captured graph; empty splits return at once.
# 16 (the first cap, measured with the first kernel) left bs-1 steps at ctx 4096 with 4 serial tiles per program.
MAX_SPLITS = 64


def choose_num_splits(
    batch_size: int,
    num_kv_heads: int,
    row_blocks: int,
    device: torch.device,
    max_splits: int = MAX_SPLITS,
) -> int:
    """How many programs share one row block's KV range: about one program per SM (rounded up to a power
    of two). Two waves (the rule before) gave bs 1 with 8 KV heads 64 splits; the decode attention sweep on
    the H200 (decode attention at bs 1, the kernel alone) measured 32 faster at ctx 4096 (0.6B 13.4 ->
    11.1 us per layer, 8B 15.9 -> 12.7) and at ctx 512 (5.8 -> 4.9, 7.5 -> 5.8): fewer partials to write and
    merge, and the merging program's serial tail reads half as many. Rounding down for extends instead, so
    that fewer, longer programs still cover 90 % of the SMs and a 16-row block's merge fits one pass in the
    kernel, was 1.04-1.76x slower at every bs 4 and 16 extend (0.6B on the H200): the split programs are latency
    bound, and two per SM hide each other's loads.

    Depends only on the launch shape (never on sequence lengths), so a captured graph stays valid."""
    programs = max(1, batch_size * num_kv_heads * row_blocks)
    sms = num_sms(device)
    splits = next_pow2(math.ceil(sms / programs))
    return max(1, min(max_splits, splits))


@dataclass(frozen=True, slots=True)
class Overrides:
    """`paged_attention`'s launch options as the caller gave them (None: the launch-shape rules choose)."""

    num_splits: int | None
    block_m: int | None
    block_n: int | None
    num_warps: int
    num_stages: int | None
    fused_rows: int | None
    merge_passes: int


@dataclass(frozen=True, slots=True)
class Launch:
    """One `paged_attention` call's launch shape: its grid, tiles, split count and merge choice."""

    batch_size: int
    num_kv_heads: int
    group: int
    head_dim: int
    row_blocks: int
    block_m: int
    block_n: int
    block_d: int
    num_splits: int
    num_stages: int
    num_warps: int
    block_s: int  # num_splits rounded up to a power of two (at least 2)
    merge_rows: int  # rows the fused merge loads per pass
    fused_merge: bool  # the main kernel merges the split partials itself (no merge launch)

    def grid(self) -> tuple[int, int, int]:
        return (self.batch_size, self.num_kv_heads * self.row_blocks, self.num_splits)

    def constexprs(self, q: torch.Tensor, eager_loads: bool, prefetch: bool) -> dict:
        """The main kernel's compile-time arguments and launch options (PDL's apart)."""
        return dict(
            GROUP=self.group,
            HEAD_DIM=self.head_dim,
            BLOCK_D=self.block_d,
            BLOCK_M=self.block_m,
            BLOCK_N=self.block_n,
            NUM_SPLITS=self.num_splits,
            IEEE=q.dtype == torch.float32,
            EAGER_LOADS=eager_loads,
            PREFETCH=prefetch,
            FUSED_MERGE=self.fused_merge,
            BLOCK_S=self.block_s,
            MERGE_ROWS=self.merge_rows,
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )


def row_tiles(
    rows: int, batch_size: int, num_kv_heads: int, device: torch.device, opts: Overrides
) -> tuple[int, int, int, int]:
    """(rows per program, pipeline stages, row blocks, KV splits) for `rows` query rows per sequence."""
    block_m = row_block_size(rows) if opts.block_m is None else opts.block_m
    num_stages = attention_stages(rows, block_m) if opts.num_stages is None else opts.num_stages
    row_blocks = cdiv(rows, block_m)
    num_splits = opts.num_splits
    if num_splits is None:
        num_splits = 1 if rows > 64 else choose_num_splits(batch_size, num_kv_heads, row_blocks, device)
    return block_m, num_stages, row_blocks, num_splits


def kv_tile(block_d: int, block_n: int | None) -> int:
    """KV tokens per tile: the default for the head size, or the caller's (checked) override."""
    if block_n is None:
        return 64 if block_d <= 128 else 32
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"paged_attention: block_n must be a power of two >= 16, got {block_n}")
    return block_n


def fused_merge_shape(
    rows: int, block_m: int, block_s: int, block_d: int, opts: Overrides
) -> tuple[int, bool]:
    """(rows merged per pass, whether the fused merge may take the row block). The fused merge is one
    program's serial tail: for the few rows of a decode (or a 2-token extend at GQA 2), and (merge_passes)
    for row blocks it merges in that many passes; more rows merge in the second kernel, one program per row."""
    few = rows <= (opts.fused_rows or FUSED_MERGE_MAX_ROWS)  # these keep the merge of 2 rows a pass
    block_rows = min(rows, block_m)
    merge_rows = (
        2 if few else fused_merge_rows(block_rows, block_s, block_d, opts.num_warps, opts.merge_passes)
    )
    passes = -(-block_rows // merge_rows)
    return merge_rows, few or passes <= opts.merge_passes


def plan_launch(
    q: torch.Tensor,
    num_kv_heads: int,
    batch_size: int,
    max_extend_len: int,
    tickets: bool,
    opts: Overrides,
) -> Launch:
    """The launch shape from the batch's shape (`q` for its heads, head size and device), whether the caller
    gave tickets, and the caller's overrides."""
    head_dim = q.shape[2]
    group = q.shape[1] // num_kv_heads
    rows = max_extend_len * group
    block_m, num_stages, row_blocks, num_splits = row_tiles(rows, batch_size, num_kv_heads, q.device, opts)
    block_d = next_pow2(head_dim)
    block_n = kv_tile(block_d, opts.block_n)
    block_s = max(2, next_pow2(num_splits))
    merge_rows, mergeable = fused_merge_shape(rows, block_m, block_s, block_d, opts)
    fused_merge = num_splits > 1 and tickets and mergeable
    return Launch(
        batch_size, num_kv_heads, group, head_dim, row_blocks, block_m, block_n, block_d,
        num_splits, num_stages, opts.num_warps, block_s, merge_rows, fused_merge,
    )  # fmt: skip


def launch_variant(
    q: torch.Tensor,
    num_kv_heads: int,
    batch_size: int,
    max_extend_len: int,
    tickets: bool,
    num_splits: int | None = None,
    block_m: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    eager_loads: bool = True,
    prefetch: bool = False,
    block_n: int | None = None,
    fused_rows: int | None = None,
    merge_passes: int = 0,
) -> tuple:
    """What one `paged_attention` launch compiles to, its pointers' alignment apart: the main kernel's
    compile-time arguments (`Launch.constexprs`), and whether its row-block count is 1 or a multiple of 16
    (Triton specializes an integer argument on both). Launches of one variant run one compiled kernel. `q`
    gives the heads, head size, dtype and device (a tensor of no tokens will do); `tickets`: whether the launch
    passes them; the rest as `paged_attention` takes them."""
    opts = Overrides(num_splits, block_m, block_n, num_warps, num_stages, fused_rows, merge_passes)
    plan = plan_launch(q, num_kv_heads, batch_size, max_extend_len, tickets, opts)
    blocks = plan.row_blocks
    specialized = 1 if blocks == 1 else (16 if blocks % 16 == 0 else 0)
    return (*sorted(plan.constexprs(q, eager_loads, prefetch).items()), specialized)
