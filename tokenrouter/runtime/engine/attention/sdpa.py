"""Gather + SDPA attention backend: correct on every device, the reference for the fast ones.

`init_forward_metadata` builds, per step, a padded view of the batch: for each row the KV slot indices of
its whole sequence (padded with slot 0), a boolean mask [B, 1, max_q, max_kv] (causal within the row, the
padding masked out; padding query rows see slot 0 only so that no row is all-masked), and the scatter
index of each new token into the padded [B, max_q] query grid. `forward` writes the new K/V, gathers the
KV rows, runs one batched `scaled_dot_product_attention` and scatters the result back to [T, ...]. The
forward does no host sync; its shapes come from the metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tokenrouter.runtime.engine.attention.base import AttentionBackend
from tokenrouter.runtime.engine.forward_batch import ForwardBatch


@dataclass(slots=True)
class SdpaMetadata:
    kv_indices: torch.Tensor  # [B, max_kv] int64 slot ids (0 = padding)
    mask: torch.Tensor  # [B, 1, max_q, max_kv] bool, True = attend
    q_dst: torch.Tensor  # [T] int64 index into the flattened [B * max_q] query grid
    max_q: int


class SdpaAttnBackend(AttentionBackend):
    name = "sdpa"

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        fb = forward_batch
        if fb.req_to_token_pool is None:
            raise ValueError("the SDPA backend needs a ForwardBatch with req_to_token_pool set")
        device = fb.input_ids.device
        bs, max_q, max_kv = fb.batch_size, fb.max_extend_len, fb.max_seq_len
        table = fb.req_to_token_pool.req_to_token
        cols = torch.arange(max_kv, device=device)
        rows = fb.req_pool_indices
        kv_valid = cols[None, :] < fb.seq_lens[:, None]  # [B, max_kv]
        kv_indices = torch.where(kv_valid, table[rows, :max_kv].to(torch.int64), 0)
        q_idx = torch.arange(max_q, device=device)
        q_valid = q_idx[None, :] < fb.extend_seq_lens[:, None]  # [B, max_q]
        q_pos = fb.extend_prefix_lens[:, None] + q_idx[None, :]  # position of each query slot
        mask = (cols[None, None, :] <= q_pos[:, :, None]) & q_valid[:, :, None] & kv_valid[:, None, :]
        mask[:, :, 0] |= ~q_valid  # padding queries attend to column 0 only (their output is dropped)
        token_row = torch.repeat_interleave(torch.arange(bs, device=device), fb.extend_seq_lens)
        token_col = torch.arange(fb.num_tokens, device=device) - fb.qo_indptr[:-1][token_row]
        fb.attn_metadata = SdpaMetadata(
            kv_indices=kv_indices, mask=mask[:, None], q_dst=token_row * max_q + token_col, max_q=max_q
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        fb = forward_batch
        md: SdpaMetadata = fb.attn_metadata
        pool = fb.token_to_kv_pool
        pool.set_kv_buffer(layer_id, fb.out_cache_loc, k, v)
        k_buf, v_buf = pool.get_kv_buffer(layer_id)
        cfg = self.config
        bs = md.kv_indices.shape[0]
        kk = k_buf[md.kv_indices].transpose(1, 2)  # [B, Hkv, max_kv, D]
        vv = v_buf[md.kv_indices].transpose(1, 2)
        qq = q.new_zeros(bs * md.max_q, cfg.num_heads, cfg.head_dim)
        qq[md.q_dst] = q
        qq = qq.view(bs, md.max_q, cfg.num_heads, cfg.head_dim).transpose(1, 2)  # [B, H, max_q, D]
        out = F.scaled_dot_product_attention(
            qq, kk, vv, attn_mask=md.mask, scale=cfg.scaling, enable_gqa=cfg.num_heads != cfg.num_kv_heads
        )
        out = out.transpose(1, 2).reshape(bs * md.max_q, cfg.num_heads, cfg.head_dim)
        return out[md.q_dst]
