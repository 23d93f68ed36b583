"""The SDPA backend against a naive per-row attention over contiguous K/V (any mix of prefix/new lengths)."""

import pytest
import torch

from tokenrouter.runtime.engine.attention import AttentionConfig, SdpaAttnBackend
from tokenrouter.runtime.engine.forward_batch import ForwardBatch, ForwardMode
from tokenrouter.runtime.engine.memory_pool import MHATokenToKVPool, ReqToTokenPool


def naive(q, k, v, prefix, scale, group):
    # q [n, H, D]; k, v [prefix + n, Hkv, D]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    n, total = q.shape[0], k.shape[0]
    allowed = torch.arange(total)[None, :] <= (prefix + torch.arange(n))[:, None]
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


@pytest.mark.parametrize(
    "rows",
    [
        [(0, 5)],  # prefill
        [(3, 1), (7, 1), (1, 1)],  # decode
        [(0, 4), (6, 1), (2, 3)],  # mixed
        [(5, 2), (0, 1)],
    ],
)
def test_sdpa_matches_naive(rows):
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, layers = 4, 2, 8, 2
    cfg = AttentionConfig(heads, kv_heads, dim, dim**-0.5, layers, torch.float32, torch.device("cpu"))
    backend = SdpaAttnBackend(cfg)
    r2t = ReqToTokenPool(8, 32, "cpu")
    pool = MHATokenToKVPool(64, torch.float32, kv_heads, dim, layers, "cpu")
    # scatter each row's prefix in the pool at shuffled slots, then run the new tokens through the backend
    full_k, full_v, req_idx, locs = [], [], [], []
    for prefix, new in rows:
        r = r2t.alloc()
        slots = pool.alloc(prefix + new)
        slots = slots[torch.randperm(slots.numel(), generator=g)]
        r2t.write(r, 0, slots)
        kk = torch.randn(prefix + new, kv_heads, dim, generator=g)
        vv = torch.randn(prefix + new, kv_heads, dim, generator=g)
        for layer in range(layers):
            pool.set_kv_buffer(layer, slots[:prefix], kk[:prefix], vv[:prefix])
        full_k.append(kk)
        full_v.append(vv)
        req_idx.append(r)
        locs.append(slots[prefix:])
    fb = ForwardBatch.build(
        input_ids=[0] * sum(n for _, n in rows),
        out_cache_loc=torch.cat(locs),
        req_pool_indices=req_idx,
        extend_prefix_lens=[p for p, _ in rows],
        extend_seq_lens=[n for _, n in rows],
        device=torch.device("cpu"),
        req_to_token_pool=r2t,
        token_to_kv_pool=pool,
    )
    if all(n == 1 for _, n in rows):
        assert fb.forward_mode == ForwardMode.DECODE
    backend.init_forward_metadata(fb)
    q = torch.randn(fb.num_tokens, heads, dim, generator=g)
    k_new = torch.cat([kk[p:] for kk, (p, _) in zip(full_k, rows, strict=True)])
    v_new = torch.cat([vv[p:] for vv, (p, _) in zip(full_v, rows, strict=True)])
    out = backend.forward(q, k_new, v_new, 1, fb)
    start = 0
    for (prefix, new), kk, vv in zip(rows, full_k, full_v, strict=True):
        want = naive(q[start : start + new], kk, vv, prefix, dim**-0.5, heads // kv_heads)
        torch.testing.assert_close(out[start : start + new], want, rtol=1e-5, atol=1e-5)
        start += new
    # the new K/V landed in the pool at out_cache_loc
    torch.testing.assert_close(pool.k_buffer[1][fb.out_cache_loc], k_new)
