"""The launch shape of paged attention (`attention.paged_attention`): query rows per program, KV splits,
pipeline stages and the fused split merge's rows and tickets. Each depends on the launch shape only (never
on sequence lengths), so a captured CUDA graph stays valid."""

from __future__ import annotations

import functools
import math

import torch
import triton

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
    splits = triton.next_power_of_2(math.ceil(sms / programs))
    return max(1, min(max_splits, splits))
