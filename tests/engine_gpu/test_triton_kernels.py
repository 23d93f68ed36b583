"""The Triton paged-attention kernels against a plain torch reference.

Without CUDA the kernels run under Triton's interpreter on CPU tensors (small shapes: seconds); with
CUDA they also run compiled, in bf16, at realistic shapes (marked gpu)."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.runtime.engine.kernels import attention as ka
from tokenrouter.runtime.engine.kernels import attention_shapes as ks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _make_batch(seq_lens, ext_lens, kv_heads, head_dim, group, dtype, device, gen, pool_slots=None):
    """A paged batch with shuffled slots: returns q, k_buf, v_buf, table tensors."""
    total_kv = sum(seq_lens)
    slots = pool_slots or total_kv + 7
    perm = torch.randperm(slots - 1, generator=gen)[:total_kv] + 1  # slot 0 is padding
    max_len = max(seq_lens) + 3
    req_to_token = torch.zeros((len(seq_lens) + 2, max_len), dtype=torch.int32)
    req_idx = torch.randperm(len(seq_lens) + 2, generator=gen)[: len(seq_lens)]
    off = 0
    for b, n in enumerate(seq_lens):
        req_to_token[req_idx[b], :n] = perm[off : off + n].to(torch.int32)
        off += n
    k_buf = torch.randn((slots, kv_heads, head_dim), generator=gen).to(dtype)
    v_buf = torch.randn((slots, kv_heads, head_dim), generator=gen).to(dtype)
    num_tokens = sum(ext_lens)
    q = torch.randn((num_tokens, kv_heads * group, head_dim), generator=gen).to(dtype)
    starts = torch.tensor([0, *torch.tensor(ext_lens).cumsum(0)[:-1].tolist()], dtype=torch.int32)
    t = dict(
        req_to_token=req_to_token,
        req_pool_indices=req_idx.to(torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        extend_start_loc=starts,
        extend_lens=torch.tensor(ext_lens, dtype=torch.int32),
    )
    t = {k: v.to(device) for k, v in t.items()}
    return q.to(device), k_buf.to(device), v_buf.to(device), t


def _reference(q, k_buf, v_buf, t, sm_scale):
    out = torch.empty_like(q, dtype=torch.float32)
    group = q.shape[1] // k_buf.shape[1]
    for b in range(t["seq_lens"].shape[0]):
        n, e = int(t["seq_lens"][b]), int(t["extend_lens"][b])
        s = int(t["extend_start_loc"][b])
        locs = t["req_to_token"][int(t["req_pool_indices"][b]), :n].long()
        k = k_buf[locs].float().repeat_interleave(group, dim=1)  # [n, H, D]
        v = v_buf[locs].float().repeat_interleave(group, dim=1)
        qb = q[s : s + e].float()  # [e, H, D]
        scores = torch.einsum("ehd,nhd->hen", qb, k) * sm_scale
        pos = torch.arange(n - e, n, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(n, device=q.device)[None, :] > pos, float("-inf"))
        out[s : s + e] = torch.einsum("hen,nhd->ehd", scores.softmax(-1), v)
    return out


CASES = [
    # (seq_lens, ext_lens, kv_heads, group, head_dim, num_splits)
    ([5, 17, 1], [1, 1, 1], 2, 2, 16, None),  # decode, GQA 2
    ([40, 9], [1, 1], 1, 4, 32, 4),  # decode, split KV, some splits empty
    ([12, 30, 7], [3, 8, 7], 2, 2, 16, None),  # extend (7 = prefill of 7)
    ([70, 20], [1, 20], 1, 2, 16, 2),  # mixed decode + prefill, split
    ([33], [33], 2, 1, 24, 1),  # prefill, MHA, head_dim not a power of two, several row blocks
    # extends of 40 and 24 tokens at GQA 4 (160 query rows), split, as the backend splits launches of up to
    # `attn_split_rows` rows (`metadata_for`; 256 by default, once 64): the kernel gives the same result past 64
    # rows (unsplit, such steps took twice as long on the H200 at a 3,000-token context)
    ([300, 90], [40, 24], 2, 4, 32, 8),
]


@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "prefetch"])
@pytest.mark.parametrize("case", CASES)
def test_paged_attention_matches_reference(case, prefetch):
    seq_lens, ext_lens, kv_heads, group, head_dim, splits = case
    gen = torch.Generator().manual_seed(sum(seq_lens) + head_dim)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    q, k_buf, v_buf, t = _make_batch(seq_lens, ext_lens, kv_heads, head_dim, group, dtype, DEVICE, gen)
    out = torch.full_like(q, float("nan"))
    scale = head_dim**-0.5
    ka.paged_attention(
        q, k_buf, v_buf, out, **t, max_extend_len=max(ext_lens), sm_scale=scale, num_splits=splits,
        prefetch=prefetch,
    )  # fmt: skip
    want = _reference(q, k_buf, v_buf, t, scale)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)


def test_split_count_does_not_change_the_result():
    gen = torch.Generator().manual_seed(3)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    q, k_buf, v_buf, t = _make_batch([50, 3], [2, 3], 1, 16, 2, dtype, DEVICE, gen)
    outs = []
    # 64: one busy split of 64 tokens, 63 empty ones; both load orders
    variants = [(1, True, False), (2, True, False), (8, True, False), (64, True, False), (8, False, False)]
    variants += [(64, False, False), (1, True, True), (8, True, True), (64, True, True)]  # + prefetch
    for splits, eager, prefetch in variants:
        out = torch.empty_like(q)
        ka.paged_attention(q, k_buf, v_buf, out, **t, max_extend_len=3, sm_scale=0.25, num_splits=splits,
                           eager_loads=eager, prefetch=prefetch)  # fmt: skip
        outs.append(out.float())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    for other in outs[1:]:
        torch.testing.assert_close(outs[0], other, atol=tol, rtol=tol)


@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "prefetch"])
@pytest.mark.parametrize(
    "case",
    [c for c in CASES if c[5] != 1]
    + [([300, 9], [1, 1], 2, 2, 16, 8), ([200, 70], [6, 2], 2, 2, 16, 4)],  # 5 busy splits; extends
)
@pytest.mark.parametrize("max_rows", [None, 64], ids=["default_rows", "every_block"])
def test_fused_split_merge_matches_reference(case, prefetch, max_rows, monkeypatch):
    """The merge folded into the attention kernel (the last program of each row block, by ticket): the
    same result as the reference, the tickets back at zero, and the same buffer reused by the next launch
    (a graph replay, the next layer) with other sequence lengths."""
    if max_rows is not None:  # the in-kernel merge for every row block (by default: up to 4 rows)
        monkeypatch.setattr(ks, "FUSED_MERGE_MAX_ROWS", max_rows)
    seq_lens, ext_lens, kv_heads, group, head_dim, splits = case
    gen = torch.Generator().manual_seed(sum(seq_lens) + head_dim + 1)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    need = ks.attention_tickets(len(seq_lens), kv_heads, max(ext_lens), group)
    tickets = torch.zeros(need + 3, dtype=torch.int32, device=DEVICE)
    for trial in range(2):
        lens = [n + 5 * trial for n in seq_lens]  # longer sequences in the second launch
        q, k_buf, v_buf, t = _make_batch(lens, ext_lens, kv_heads, head_dim, group, dtype, DEVICE, gen)
        out = torch.full_like(q, float("nan"))
        ka.paged_attention(
            q, k_buf, v_buf, out, **t, max_extend_len=max(ext_lens), sm_scale=head_dim**-0.5,
            num_splits=splits or 4, prefetch=prefetch, tickets=tickets,
        )  # fmt: skip
        torch.testing.assert_close(
            out.float(), _reference(q, k_buf, v_buf, t, head_dim**-0.5), atol=tol, rtol=tol
        )
        assert not tickets.any()


@pytest.mark.parametrize(
    "case",
    [
        ([12, 30, 7], [3, 8, 7], 2, 2, 16, 4),
        ([300, 9], [8, 8], 2, 2, 16, 8),
        ([200, 70], [6, 2], 2, 2, 32, 2),
    ],
)
def test_merge_passes_fold_wider_blocks(case, monkeypatch):
    """`merge_passes`: row blocks above `fused_rows` merge in the kernel too, several rows per pass
    (`fused_merge_rows`), with no merge launch; the reference's result and the tickets back at zero."""
    seq_lens, ext_lens, kv_heads, group, head_dim, splits = case
    gen = torch.Generator().manual_seed(sum(seq_lens) + 7)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    q, k_buf, v_buf, t = _make_batch(seq_lens, ext_lens, kv_heads, head_dim, group, dtype, DEVICE, gen)
    tickets = torch.zeros(ks.attention_tickets(len(seq_lens), kv_heads, max(ext_lens), group), dtype=torch.int32,
                          device=DEVICE)  # fmt: skip
    launches = []
    real = ka._merge_splits_kernel

    class Counted:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    monkeypatch.setattr(ka, "_merge_splits_kernel", Counted())
    want = _reference(q, k_buf, v_buf, t, head_dim**-0.5)
    for passes in (0, 1):
        out = torch.full_like(q, float("nan"))
        ka.paged_attention(q, k_buf, v_buf, out, **t, max_extend_len=max(ext_lens), sm_scale=head_dim**-0.5,
                           num_splits=splits, tickets=tickets, merge_passes=passes)  # fmt: skip
        torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)
        assert not tickets.any()
        assert len(launches) == 1  # the second kernel without passes (blocks of 6-16 rows), none with one


def test_fused_merge_rows_per_pass():
    """Rows per merge pass: 2 without passes; with them, as many as the tile budget holds for the splits
    (powers of two, at most the block's rows rounded up, at least 2)."""
    assert ks.fused_merge_rows(16, 8, 128, 4, 0) == 2
    assert ks.fused_merge_rows(16, 8, 128, 4, 2) == 8  # bs 4 x 8 on the 0.6B: two passes
    assert ks.fused_merge_rows(16, 2, 128, 4, 1) == 16  # bs 16: one
    assert ks.fused_merge_rows(16, 32, 128, 4, 2) == 2  # bs 1: eight (so it keeps the merge launch)
    assert ks.fused_merge_rows(6, 4, 128, 4, 1) == 8
    assert ks.fused_merge_rows(16, 64, 128, 4, 1) == 2
    assert ks.fused_merge_rows(16, 8, 128, 8, 1) == 16  # twice the threads, twice the rows


def test_fused_split_merge_argument_errors():
    gen = torch.Generator().manual_seed(5)
    q, k_buf, v_buf, t = _make_batch([9, 4], [1, 1], 2, 16, 2, torch.float32, DEVICE, gen)
    for bad in (
        torch.zeros(64, dtype=torch.int64, device=DEVICE),
        torch.zeros(1, dtype=torch.int32, device=DEVICE),
    ):
        with pytest.raises(ValueError, match="tickets"):
            ka.paged_attention(q, k_buf, v_buf, torch.empty_like(q), **t, max_extend_len=1, sm_scale=0.25,
                               num_splits=4, tickets=bad)  # fmt: skip


def test_decode_split_count_on_an_h200(monkeypatch):
    """bs 1 decode with 8 KV heads on 132 SMs: 32 splits (about one program per SM; the sweep's best at ctx
    4096), 16 under the old cap; larger batches split less; the count depends only on the launch shape."""
    monkeypatch.setattr(ks, "num_sms", lambda device: 132)
    cpu = torch.device("cpu")
    assert ks.choose_num_splits(1, 8, 1, cpu) == 32
    assert ks.choose_num_splits(1, 8, 1, cpu, 16) == 16  # a cap of 16
    assert ks.choose_num_splits(2, 8, 1, cpu) == 16
    assert ks.choose_num_splits(8, 8, 1, cpu) == 4
    assert ks.choose_num_splits(64, 8, 1, cpu) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("ctx", [512, 4096])
@pytest.mark.parametrize("kind", ["decode", "extend", "prefill"])
def test_paged_attention_realistic_shapes_gpu(ctx, kind):
    gen = torch.Generator().manual_seed(ctx)
    bs = {"decode": 16, "extend": 8, "prefill": 2}[kind]
    ext = {"decode": 1, "extend": 5, "prefill": ctx}[kind]
    q, k_buf, v_buf, t = _make_batch([ctx] * bs, [ext] * bs, 8, 128, 4, torch.bfloat16, "cuda", gen)
    out = torch.empty_like(q)
    ka.paged_attention(q, k_buf, v_buf, out, **t, max_extend_len=ext, sm_scale=128**-0.5)
    want = _reference(q, k_buf, v_buf, t, 128**-0.5)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
