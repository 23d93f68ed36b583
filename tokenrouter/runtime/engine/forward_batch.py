"""`ForwardBatch`: everything one model forward step reads, as device tensors of fixed shape.

Built by the engine on the host from the step's rows, *before* the model runs; the model forward itself
only reads these tensors, so it can be captured in a CUDA graph for a fixed (batch size B, token count T).

Layout (T = Σ extend_seq_lens, rows are requests, tokens of one row are contiguous and in order):
- `input_ids` [T] int64, `positions` [T] int64 (the token's index in its sequence),
  `out_cache_loc` [T] int64: the KV slot each new token's K/V is written to.
- `req_pool_indices` [B] int64: each row's row in `req_to_token_pool.req_to_token`.
- `seq_lens` [B] int64: tokens with KV after this step (prefix + new), `extend_prefix_lens` [B] int64:
  tokens already in the cache before this step, `extend_seq_lens` [B] int64: new tokens this step.
- `qo_indptr` [B+1] int64: row i's new tokens are `input_ids[qo_indptr[i]:qo_indptr[i+1]]`.
- `last_indices` [B] int64 = qo_indptr[1:] − 1: the token whose logits/hidden state each row returns.
- Host copies (`*_cpu`, plain tuples of int) and `max_seq_len` / `max_extend_len` for code that runs outside
  the graph (`AttentionBackend.init_forward_metadata`, a graph runner's `can_run`). Never read in the forward.
- `req_to_token_pool`, `token_to_kv_pool`: the pools (the attention backend writes K/V into the latter and
  reads the page table from the former).
- `attn_metadata`: whatever the attention backend's `init_forward_metadata` prepared (backend-private).
- `token_rows` [T] int64: each new token's request row (`req_pool_indices` repeated by `extend_seq_lens`),
  what `write_req_to_token` indexes the table with; None in a batch assembled by hand (then computed).
- `host_ints`: when built by `build`, the CPU int64 tensor the device tensors were copied from, laid out
  [input_ids | positions | out_cache_loc | token_rows | req_pool_indices | seq_lens | extend_prefix_lens |
  extend_seq_lens | qo_indptr | last_indices]: the four token columns and the four row columns are each one
  [4, T] / [4, B] block, as in a graph runner's static buffers (it fills them from here with a few numpy
  copies). Never written.

Padding (for graph replay of a smaller batch in a larger captured shape): a padding *token* has
`input_ids` 0, `positions` 0, `out_cache_loc` 0 (KV slot 0 is the reserved dummy slot, never allocated);
a padding *row* has `req_pool_indices` 0 (row 0 of the request table is reserved and all zeros, i.e. it
points at slot 0), `seq_lens` 1, `extend_prefix_lens` 0, `extend_seq_lens` = its padding tokens (≥ 1).
Padding rows' outputs are garbage and dropped by whoever padded.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from tokenrouter.runtime.engine.memory_pool import MHATokenToKVPool, ReqToTokenPool


class ForwardMode(IntEnum):
    """DECODE: every row has exactly one new token. EXTEND: every row has more than one (a first prefill,
    a re-prefill after eviction, or the tokens a peer wrote). MIXED: both kinds in one step. Attention
    backends must be correct for any mode; the mode is a hint for picking kernels and graphs."""

    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_mixed(self) -> bool:
        return self == ForwardMode.MIXED


@dataclass(slots=True, eq=False)
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    num_tokens: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    extend_prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    qo_indptr: torch.Tensor
    last_indices: torch.Tensor
    seq_lens_cpu: tuple[int, ...]
    extend_prefix_lens_cpu: tuple[int, ...]
    extend_seq_lens_cpu: tuple[int, ...]
    max_seq_len: int
    max_extend_len: int
    req_to_token_pool: ReqToTokenPool | None = None
    token_to_kv_pool: MHATokenToKVPool | None = None
    attn_metadata: Any = None
    extra: dict = field(default_factory=dict)
    host_ints: torch.Tensor | None = None
    token_rows: torch.Tensor | None = None

    @classmethod
    def build(
        cls,
        *,
        input_ids: list[int],
        out_cache_loc: torch.Tensor,
        req_pool_indices: list[int],
        extend_prefix_lens: list[int],
        extend_seq_lens: list[int],
        device: torch.device,
        req_to_token_pool: ReqToTokenPool | None = None,
        token_to_kv_pool: MHATokenToKVPool | None = None,
    ) -> ForwardBatch:
        """Build from host lists with one host-to-device copy. `out_cache_loc`: the new tokens' KV slots
        (a CPU tensor, as the pool's allocator hands them out). With a CPU `device` nothing is copied: the
        tensors are views of `host_ints`, and `to(device)` moves them later (a graph runner reads only the
        host ints, so a step that replays a graph never makes the device copies)."""
        bs = len(req_pool_indices)
        num_tokens = _check_rows(
            len(input_ids), out_cache_loc, req_pool_indices, extend_prefix_lens, extend_seq_lens
        )
        max_extend = max(extend_seq_lens)
        mode, positions, token_rows, seq_lens, indptr, last = _token_layout(
            req_pool_indices, extend_prefix_lens, extend_seq_lens
        )
        host = _host_ints(
            input_ids, positions, out_cache_loc.tolist(), token_rows, req_pool_indices, seq_lens,
            extend_prefix_lens, extend_seq_lens, indptr, last,
        )  # fmt: skip
        return cls(
            forward_mode=mode,
            batch_size=bs,
            num_tokens=num_tokens,
            **cls._device_parts(host, num_tokens, bs, device),
            seq_lens_cpu=tuple(seq_lens),
            extend_prefix_lens_cpu=tuple(extend_prefix_lens),
            extend_seq_lens_cpu=tuple(extend_seq_lens),
            max_seq_len=max(seq_lens),
            max_extend_len=max_extend,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
            host_ints=host,
        )

    @staticmethod
    def _device_parts(
        host: torch.Tensor, t: int, b: int, device: torch.device | str
    ) -> dict[str, torch.Tensor]:
        """The device tensors of a batch, cut from its host ints after one copy (none on the CPU)."""
        device = torch.device(device)
        dev = host if device.type == "cpu" else host.to(device, non_blocking=True)
        ids, pos, loc, rows, req, seq, prefix, ext, indptr, last = dev.split_with_sizes(
            (t, t, t, t, b, b, b, b, b + 1, b)
        )
        return dict(
            input_ids=ids,
            positions=pos,
            out_cache_loc=loc,
            token_rows=rows,
            req_pool_indices=req,
            seq_lens=seq,
            extend_prefix_lens=prefix,
            extend_seq_lens=ext,
            qo_indptr=indptr,
            last_indices=last,
        )

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def to(self, device: torch.device | str) -> ForwardBatch:
        """This batch with its tensors on `device` (itself when they are there already): one copy of
        `host_ints`. Attention metadata is not carried over (it is prepared per device)."""
        device = torch.device(device)
        if self.device == device or (device.type == self.device.type and device.index is None):
            return self
        if self.host_ints is None:
            raise ValueError("ForwardBatch.to needs a batch built by ForwardBatch.build (its host ints)")
        moved = dataclasses.replace(self, attn_metadata=None, extra={})
        for name, value in self._device_parts(
            self.host_ints, self.num_tokens, self.batch_size, device
        ).items():
            setattr(moved, name, value)
        return moved


def write_req_to_token(fb: ForwardBatch, token_rows: torch.Tensor | None = None) -> None:
    """req_to_token[row of token i, positions[i]] = out_cache_loc[i] for every new token of `fb`: where its
    K/V goes, before attention reads the table. `token_rows` (the request row of each token) is computed
    from the batch when neither given nor in the batch (`build` stages it with the other ints; a graph runner passes
    its static copy: no sync, fixed shape)."""
    if token_rows is None:
        token_rows = fb.token_rows
    if token_rows is None:
        token_rows = fb.req_pool_indices.repeat_interleave(fb.extend_seq_lens, output_size=fb.num_tokens)
    fb.req_to_token_pool.req_to_token[token_rows, fb.positions] = fb.out_cache_loc.to(torch.int32)


def _check_rows(
    num_ids: int,
    out_cache_loc: torch.Tensor,
    req_pool_indices: list[int],
    prefix_lens: list[int],
    ext_lens: list[int],
) -> int:
    """The batch's new tokens; ValueError for row lists `ForwardBatch.build` cannot take."""
    bs = len(req_pool_indices)
    if bs == 0:
        raise ValueError("a ForwardBatch needs at least one row")
    if not (len(prefix_lens) == len(ext_lens) == bs):
        raise ValueError("row lists of a ForwardBatch differ in length")
    if min(ext_lens) < 1:
        raise ValueError("every row of a ForwardBatch needs at least one new token")
    num_tokens = bs if max(ext_lens) == 1 else sum(ext_lens)
    if num_ids != num_tokens or out_cache_loc.numel() != num_tokens:
        raise ValueError("input_ids / out_cache_loc do not match Σ extend_seq_lens")
    return num_tokens


def _token_layout(req_pool_indices: list[int], prefix_lens: list[int], ext_lens: list[int]) -> tuple:
    """(mode, each token's position and request row, then each row's sequence length, qo_indptr and last
    token index) of a batch's rows."""
    bs = len(req_pool_indices)
    if max(ext_lens) == 1:  # decode: one token per row, at position prefix
        indptr = list(range(bs + 1))
        seq_lens = [p + 1 for p in prefix_lens]
        return ForwardMode.DECODE, list(prefix_lens), list(req_pool_indices), seq_lens, indptr, indptr[:bs]
    mode = ForwardMode.EXTEND if min(ext_lens) > 1 else ForwardMode.MIXED
    positions: list[int] = []
    token_rows: list[int] = []
    for p, n, r in zip(prefix_lens, ext_lens, req_pool_indices, strict=True):
        positions.extend(range(p, p + n))
        token_rows.extend([r] * n)
    seq_lens = [p + n for p, n in zip(prefix_lens, ext_lens, strict=True)]
    indptr = [0, *itertools.accumulate(ext_lens)]
    return mode, positions, token_rows, seq_lens, indptr, [i - 1 for i in indptr[1:]]


def _host_ints(*parts: Sequence[int]) -> torch.Tensor:
    """The lists end to end as one int64 host tensor: one array (numpy builds it from a list several times
    faster than torch.tensor), so one copy moves a step's ints."""
    flat: list[int] = []
    for part in parts:
        flat += part
    return torch.from_numpy(np.array(flat, dtype=np.int64))
