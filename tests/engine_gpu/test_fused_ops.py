"""The fused element-wise Triton ops and the Triton attention backend against torch references
(under the interpreter without CUDA; compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.runtime.engine.attention import AttentionConfig, SdpaAttnBackend
from tokenrouter.runtime.engine.attention.triton_backend import TritonAttnBackend
from tokenrouter.runtime.engine.forward_batch import ForwardBatch
from tokenrouter.runtime.engine.kernels import dot_rows as kd
from tokenrouter.runtime.engine.kernels import elementwise as ke
from tokenrouter.runtime.engine.kernels import linear as kl
from tokenrouter.runtime.engine.memory_pool import MHATokenToKVPool, ReqToTokenPool

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = dict(atol=1e-5, rtol=1e-5)


def _ref_rmsnorm(x, w, eps):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def test_rmsnorm_and_add_rmsnorm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 48, generator=g).to(DEVICE)
    w = torch.randn(48, generator=g).to(DEVICE)
    torch.testing.assert_close(ke.rmsnorm(x, w, 1e-6), _ref_rmsnorm(x, w, 1e-6), **TOL)
    res = torch.randn(5, 48, generator=g).to(DEVICE)
    want_res = res + x
    got = ke.rmsnorm(x, w, 1e-6, residual=res)
    torch.testing.assert_close(res, want_res, **TOL)  # residual updated in place
    torch.testing.assert_close(got, _ref_rmsnorm(want_res, w, 1e-6), **TOL)


def test_rmsnorm_of_some_rows_by_index():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 48, generator=g).to(DEVICE)
    w = torch.randn(48, generator=g).to(DEVICE)
    rows = torch.tensor([1, 4, 6], device=DEVICE)
    torch.testing.assert_close(ke.rmsnorm(x, w, 1e-6, rows=rows), _ref_rmsnorm(x[rows], w, 1e-6), **TOL)
    res = torch.randn(7, 48, generator=g).to(DEVICE)
    before = res.clone()
    got = ke.rmsnorm(x, w, 1e-6, residual=res, rows=rows)
    torch.testing.assert_close(got, _ref_rmsnorm((before + x)[rows], w, 1e-6), **TOL)
    torch.testing.assert_close(res[rows], (before + x)[rows], **TOL)  # those rows of the stream updated
    with pytest.raises(ValueError, match="rows"):
        ke.rmsnorm(x, w, 1e-6, rows=torch.tensor([[0]], device=DEVICE))


def test_silu_and_mul():
    x = torch.randn(3, 2 * 40, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    gate, up = x[:, :40], x[:, 40:]
    torch.testing.assert_close(ke.silu_and_mul(x), torch.nn.functional.silu(gate) * up, **TOL)


def _rotate(x, pos, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = pos[:, None].float() * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + rot * sin, torch.cat([ang.cos(), ang.sin()], -1)


@pytest.mark.parametrize("with_norm", [True, False])
def test_qk_norm_rope_store(with_norm):
    g = torch.Generator().manual_seed(2)
    hq, hkv, d, t = 4, 2, 16, 5
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g).to(DEVICE)
    pos = torch.tensor([0, 3, 4, 9, 2], device=DEVICE)
    loc = torch.tensor([3, 1, 7, 2, 5], device=DEVICE)
    qw = torch.randn(d, generator=g).to(DEVICE) if with_norm else None
    kw = torch.randn(d, generator=g).to(DEVICE) if with_norm else None
    k_buf = torch.zeros(9, hkv, d, device=DEVICE)
    v_buf = torch.zeros(9, hkv, d, device=DEVICE)
    q, k, v = qkv.view(t, hq + 2 * hkv, d).split([hq, hkv, hkv], dim=1)
    if with_norm:
        q, k = _ref_rmsnorm(q, qw, 1e-6), _ref_rmsnorm(k, kw, 1e-6)
    want_q, cos_sin = _rotate(q, pos)
    want_k, _ = _rotate(k, pos)
    table = _rotate(torch.zeros(16, 1, d, device=DEVICE), torch.arange(16, device=DEVICE))[1]
    got_q = ke.qk_norm_rope_store(qkv, pos, table, k_buf, v_buf, loc, hq, hkv, d, qw, kw, 1e-6)
    torch.testing.assert_close(got_q, want_q, **TOL)
    torch.testing.assert_close(k_buf[loc], want_k, **TOL)
    torch.testing.assert_close(v_buf[loc], v, **TOL)
    untouched = torch.ones(9, dtype=torch.bool)
    untouched[loc.cpu()] = False
    assert not k_buf[untouched.to(DEVICE)].any() and not v_buf[untouched.to(DEVICE)].any()


def _batch(rows, heads, kv_heads, dim, layers, g):
    r2t = ReqToTokenPool(8, 64, DEVICE)
    pool = MHATokenToKVPool(128, torch.float32, kv_heads, dim, layers, DEVICE)
    req_idx, locs, new_k, new_v = [], [], [], []
    for prefix, new in rows:
        r = r2t.alloc()
        slots = pool.alloc(prefix + new)
        slots = slots[torch.randperm(slots.numel(), generator=g)]
        r2t.write(r, 0, slots)
        kk = torch.randn(prefix + new, kv_heads, dim, generator=g).to(DEVICE)
        vv = torch.randn(prefix + new, kv_heads, dim, generator=g).to(DEVICE)
        for layer in range(layers):
            pool.set_kv_buffer(layer, slots[:prefix].to(DEVICE), kk[:prefix], vv[:prefix])
        req_idx.append(r)
        locs.append(slots[prefix:])
        new_k.append(kk[prefix:])
        new_v.append(vv[prefix:])
    fb = ForwardBatch.build(
        input_ids=[0] * sum(n for _, n in rows),
        out_cache_loc=torch.cat(locs),
        req_pool_indices=req_idx,
        extend_prefix_lens=[p for p, _ in rows],
        extend_seq_lens=[n for _, n in rows],
        device=DEVICE,
        req_to_token_pool=r2t,
        token_to_kv_pool=pool,
    )
    return fb, torch.cat(new_k), torch.cat(new_v)


@pytest.mark.parametrize("rows", [[(9, 1), (0, 1), (30, 1)], [(0, 6), (11, 1), (4, 3)], [(20, 40)]])
def test_triton_backend_matches_sdpa_backend(rows):
    heads, kv_heads, dim, layers = 4, 2, 16, 2
    cfg = AttentionConfig(heads, kv_heads, dim, dim**-0.5, layers, torch.float32, DEVICE)
    outs, pools = [], []
    for backend_cls in (SdpaAttnBackend, TritonAttnBackend):
        g = torch.Generator().manual_seed(len(rows))
        fb, k_new, v_new = _batch(rows, heads, kv_heads, dim, layers, g)
        q = torch.randn(fb.num_tokens, heads, dim, generator=g).to(DEVICE)
        backend = backend_cls(cfg)
        backend.init_forward_metadata(fb)
        outs.append(backend.forward(q, k_new, v_new, 1, fb))
        pools.append(fb.token_to_kv_pool)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pools[1].k_buffer[1], pools[0].k_buffer[1])
    torch.testing.assert_close(pools[1].v_buffer[1], pools[0].v_buffer[1])


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("silu_mul", [False, True])
def test_gemv(bias, silu_mul):
    g = torch.Generator().manual_seed(bias * 2 + silu_mul)
    n, k = 40, 72  # not multiples of the blocks
    x = torch.randn(1, 2 * k if silu_mul else k, generator=g).to(DEVICE)
    w = torch.randn(n, k, generator=g).to(DEVICE)
    b = torch.randn(n, generator=g).to(DEVICE) if bias else None
    inp = torch.nn.functional.silu(x[:, :k]) * x[:, k:] if silu_mul else x
    want = torch.nn.functional.linear(inp, w, b)
    torch.testing.assert_close(kl.gemv(x, w, b, silu_mul=silu_mul), want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError):
        kl.gemv(torch.zeros(2, k, device=DEVICE), w)


@pytest.mark.parametrize("with_residual", [False, True])
def test_gemv_with_folded_rmsnorm(with_residual):
    g = torch.Generator().manual_seed(7 + with_residual)
    n, k = 40, 72
    x = torch.randn(1, k, generator=g).to(DEVICE)
    w = torch.randn(n, k, generator=g).to(DEVICE)
    nw = torch.randn(k, generator=g).to(DEVICE)
    b = torch.randn(n, generator=g).to(DEVICE)
    if with_residual:
        res = torch.randn(1, k, generator=g).to(DEVICE)
        res_before = res.clone()
        res_out = torch.full_like(res, float("nan"))
        got = kl.gemv(x, w, b, norm_weight=nw, eps=1e-6, residual=res, residual_out=res_out)
        torch.testing.assert_close(res, res_before)  # the old stream is left as it was
        torch.testing.assert_close(res_out, res_before + x, **TOL)
        want = torch.nn.functional.linear(_ref_rmsnorm(res_before + x, nw, 1e-6), w, b)
    else:
        got = kl.gemv(x, w, b, norm_weight=nw, eps=1e-6)
        want = torch.nn.functional.linear(_ref_rmsnorm(x, nw, 1e-6), w, b)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # the same as the two launches it replaces
    r = res_before.clone() if with_residual else None
    two = kl.gemv(ke.rmsnorm(x, nw, 1e-6, residual=r), w, b)
    torch.testing.assert_close(got, two, atol=1e-5, rtol=1e-5)


def test_gemv_folded_norm_argument_errors():
    x = torch.zeros(1, 8, device=DEVICE)
    w = torch.zeros(4, 8, device=DEVICE)
    nw = torch.ones(8, device=DEVICE)
    with pytest.raises(ValueError, match="residual_out must not be residual"):
        kl.gemv(x, w, norm_weight=nw, residual=x, residual_out=x)
    with pytest.raises(ValueError, match="residual needs"):
        kl.gemv(x, w, residual=x.clone(), residual_out=x.clone())
    with pytest.raises(ValueError, match="do not combine"):
        kl.gemv(torch.zeros(1, 16, device=DEVICE), w, silu_mul=True, norm_weight=nw)


def linear_case(seed: int, m: int, variant: str):
    """(x, weight, bias, silu_mul, F.linear in float64) for a few-row kernel test: N 40 and K 72, not
    multiples of any block; variant "plain", "bias" or "silu_mul" (x is [gate | up])."""
    g = torch.Generator().manual_seed(seed)
    n, k = 40, 72
    silu_mul = variant == "silu_mul"
    x = torch.randn(m, 2 * k if silu_mul else k, generator=g).to(DEVICE)
    w = torch.randn(n, k, generator=g).to(DEVICE)
    b = torch.randn(n, generator=g).to(DEVICE) if variant == "bias" else None
    inp = torch.nn.functional.silu(x[:, :k]) * x[:, k:] if silu_mul else x
    want = torch.nn.functional.linear(inp.double(), w.double(), None if b is None else b.double()).float()
    return x, w, b, silu_mul, want


@pytest.mark.parametrize("m", [2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("variant", ["plain", "bias", "silu_mul"])
def test_gemv_rows(m, variant):
    x, w, b, silu_mul, want = linear_case(m * 3 + len(variant), m, variant)
    got = kl.gemv_rows(x, w, b, silu_mul=silu_mul)
    assert got.shape == (m, w.shape[0])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # row by row it is the one-row GEMV
    one = torch.cat([kl.gemv(x[i : i + 1], w, b, silu_mul=silu_mul) for i in range(m)])
    torch.testing.assert_close(got, one, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["gemv_rows", "dot_rows"])
def test_few_row_kernels_take_strided_rows_and_bf16(kernel):
    linear = kl.gemv_rows if kernel == "gemv_rows" else kd.dot_rows
    g = torch.Generator().manual_seed(11)
    n, k = 33, 100
    wide = torch.randn(5, 160, generator=g).to(DEVICE)
    x = wide[:, :k]  # rows 160 apart
    w = torch.randn(n, k, generator=g).to(DEVICE)
    got = linear(x, w)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, w), atol=1e-4, rtol=1e-4)
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    want = torch.nn.functional.linear(xb.float(), wb.float())
    torch.testing.assert_close(linear(xb, wb).float(), want, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("m", [2, 4, 8])
@pytest.mark.parametrize("variant", ["silu_mul", "norm", "norm_residual"])
def test_gemv_rows_bf16_within_rounding_of_linear(m, variant):
    """bf16 at a 0.6B-like width (K 1024, several K tiles under the interpreter's fixed tile): the kernel is
    within bf16 rounding of F.linear (float32 sums over the bf16 inputs), every variant."""
    g = torch.Generator().manual_seed(23 + m)
    n, k = 48, 1024
    x = torch.randn(m, 2 * k if variant == "silu_mul" else k, generator=g).to(DEVICE, torch.bfloat16)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(DEVICE, torch.bfloat16)
    if variant == "silu_mul":
        got = kl.gemv_rows(x, w, silu_mul=True)
        inp = (torch.nn.functional.silu(x[:, :k].float()) * x[:, k:].float()).to(torch.bfloat16)
    else:
        nw = (1 + 0.1 * torch.randn(k, generator=g)).to(DEVICE, torch.bfloat16)
        h = x
        if variant == "norm_residual":
            res = torch.randn(m, k, generator=g).to(DEVICE, torch.bfloat16)
            res_out = torch.empty_like(res)
            got = kl.gemv_rows(x, w, norm_weight=nw, eps=1e-6, residual=res, residual_out=res_out)
            h = (x.float() + res.float()).to(torch.bfloat16)
            # one bf16 step at most (Triton's interpreter casts float32 to bf16 by truncation)
            torch.testing.assert_close(res_out.float(), h.float(), atol=0.0, rtol=2**-7)
        else:
            got = kl.gemv_rows(x, w, norm_weight=nw, eps=1e-6)
        inp = _ref_rmsnorm(h, nw, 1e-6).to(torch.bfloat16)
    want = torch.nn.functional.linear(inp.float(), w.float())
    # one bf16 rounding of the output, plus the input rounding the kernel skips (the folded norm)
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("m", [2, 5, 8])
@pytest.mark.parametrize("with_residual", [False, True])
def test_gemv_rows_with_folded_rmsnorm(m, with_residual):
    g = torch.Generator().manual_seed(17 + m + with_residual)
    n, k = 40, 72
    x = torch.randn(m, k, generator=g).to(DEVICE)
    w = torch.randn(n, k, generator=g).to(DEVICE)
    nw = torch.randn(k, generator=g).to(DEVICE)
    b = torch.randn(n, generator=g).to(DEVICE)
    if with_residual:
        res = torch.randn(m, k, generator=g).to(DEVICE) * torch.arange(1, m + 1, device=DEVICE)[:, None]
        res_before = res.clone()
        res_out = torch.full_like(res, float("nan"))
        got = kl.gemv_rows(x, w, b, norm_weight=nw, eps=1e-6, residual=res, residual_out=res_out)
        torch.testing.assert_close(res, res_before)  # the old stream is left as it was
        torch.testing.assert_close(res_out, res_before + x, **TOL)
        want = torch.nn.functional.linear(_ref_rmsnorm(res_before + x, nw, 1e-6), w, b)
    else:
        got = kl.gemv_rows(x, w, b, norm_weight=nw, eps=1e-6)
        want = torch.nn.functional.linear(_ref_rmsnorm(x, nw, 1e-6), w, b)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    r = res_before.clone() if with_residual else None  # the same as the two launches it replaces
    torch.testing.assert_close(
        got, kl.gemv_rows(ke.rmsnorm(x, nw, 1e-6, residual=r), w, b), atol=1e-5, rtol=1e-5
    )


def test_gemv_rows_argument_errors():
    w = torch.zeros(4, 8, device=DEVICE)
    nw = torch.ones(8, device=DEVICE)
    for rows in (1, kl.GEMV_ROWS_LIMIT + 1):
        with pytest.raises(ValueError, match="rows"):
            kl.gemv_rows(torch.zeros(rows, 8, device=DEVICE), w)
    x = torch.zeros(3, 8, device=DEVICE)
    with pytest.raises(ValueError, match="does not match"):
        kl.gemv_rows(torch.zeros(3, 9, device=DEVICE), w)
    with pytest.raises(ValueError, match="residual_out must not be residual"):
        kl.gemv_rows(x, w, norm_weight=nw, residual=x, residual_out=x)
    with pytest.raises(ValueError, match="residual needs"):
        kl.gemv_rows(x, w, residual=x.clone(), residual_out=x.clone())
    with pytest.raises(ValueError, match="contiguous"):
        kl.gemv_rows(x, w, norm_weight=nw, residual=torch.zeros(2, 8, device=DEVICE), residual_out=x.clone())
    with pytest.raises(ValueError, match="do not combine"):
        kl.gemv_rows(torch.zeros(3, 16, device=DEVICE), w, silu_mul=True, norm_weight=nw)


# the tensor-core few-row linear: the interpreter's fixed config (BLOCK_W 16, BLOCK_K 32, SPLIT_K 2) and
# explicit tile configs, split K from 1 (no partials) to 12 (splits past K's end: empty K ranges); "tile1"
# and "split12" are one K tile per program (K 72), as the `dot_prefetch` configs are
DOT_CONFIGS = [
    None,
    {"BLOCK_W": 16, "BLOCK_K": 16, "SPLIT_K": 1},
    {"BLOCK_W": 32, "BLOCK_K": 32, "SPLIT_K": 4},
    {"BLOCK_W": 16, "BLOCK_K": 64, "SPLIT_K": 8},
    {"BLOCK_W": 16, "BLOCK_K": 128, "SPLIT_K": 1},
    {"BLOCK_W": 16, "BLOCK_K": 16, "SPLIT_K": 12},
]
DOT_IDS = ["default", "split1", "split4", "split8", "tile1", "split12"]


@pytest.mark.parametrize("m", [1, 2, 5, 8, 13, 16, 17, 32])  # 17 and 32: the 32-row block
@pytest.mark.parametrize("variant", ["plain", "bias", "silu_mul"])
@pytest.mark.parametrize("config", DOT_CONFIGS, ids=DOT_IDS)
def test_dot_rows(m, variant, config):
    x, w, b, silu_mul, want = linear_case(m * 5 + len(variant), m, variant)
    got = kd.dot_rows(x, w, b, silu_mul=silu_mul, config=config)
    assert got.shape == (m, w.shape[0])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # a second launch on the same tickets (each launch leaves them zero) gives the same, bit for bit
    torch.testing.assert_close(kd.dot_rows(x, w, b, silu_mul=silu_mul, config=config), got, atol=0, rtol=0)


@pytest.mark.parametrize("m", [1, 3, 16, 27])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("config", DOT_CONFIGS, ids=DOT_IDS)
def test_dot_rows_with_folded_rmsnorm(m, with_residual, config):
    """add & RMSNorm folded in: the same as rmsnorm (which adds the residual in place) then a linear, and the
    new residual stream in residual_out (the old one untouched)."""
    g = torch.Generator().manual_seed(31 + m + with_residual)
    n, k = 40, 72
    x = torch.randn(m, k, generator=g).to(DEVICE)
    w = torch.randn(n, k, generator=g).to(DEVICE)
    nw = torch.randn(k, generator=g).to(DEVICE)
    res = torch.randn(m, k, generator=g).to(DEVICE) if with_residual else None
    out = torch.empty_like(x) if with_residual else None
    h = x + res if with_residual else x
    want = torch.nn.functional.linear(_ref_rmsnorm(h, nw, 1e-6), w)
    kept = res.clone() if with_residual else None
    got = kd.dot_rows(x, w, norm_weight=nw, eps=1e-6, residual=res, residual_out=out, config=config)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    if with_residual:
        torch.testing.assert_close(out, h, **TOL)
        torch.testing.assert_close(res, kept, atol=0, rtol=0)
    again = kd.dot_rows(x, w, norm_weight=nw, eps=1e-6, residual=res, residual_out=out, config=config)
    torch.testing.assert_close(again, got, atol=0, rtol=0)


def test_dot_rows_prefetch_tunes_over_one_tile_configs():
    """With PREFETCH_W the autotuner's candidates read a program's whole weight slice in one K tile at the
    small models' K (1024, 2048, 3072); without it, the run-H tile list."""
    assert kd._dot_rows_prune(None, {"K": 1024}) == kd._DOT_ROWS_CONFIGS
    assert kd._dot_rows_prune(None, {"K": 1024}, PREFETCH_W=False) == kd._DOT_ROWS_CONFIGS
    for k in (1024, 2048, 3072):
        one = kd._dot_rows_prune(None, {"K": k}, PREFETCH_W=True)
        assert one and all(-(-k // c.kwargs["SPLIT_K"]) <= c.kwargs["BLOCK_K"] for c in one), k
        assert all(c.kwargs["SPLIT_K"] <= kd._DOT_ROWS_MAX_SPLIT for c in one)
    assert kd._dot_rows_prune(None, {"K": 8192}, PREFETCH_W=True) == kd._DOT_ROWS_ONE_TILE_CONFIGS


def test_dot_rows_argument_errors():
    n, k = 33, 100
    x = torch.zeros(5, k, device=DEVICE)
    w = torch.zeros(n, k, device=DEVICE)
    with pytest.raises(ValueError, match="1-32 rows"):
        kd.dot_rows(torch.zeros(33, k, device=DEVICE), w)
    with pytest.raises(ValueError, match="does not match the weight"):
        kd.dot_rows(torch.zeros(2, k, device=DEVICE), w, silu_mul=True)
    with pytest.raises(ValueError, match="do not combine"):
        kd.dot_rows(
            torch.zeros(2, 2 * k, device=DEVICE), w, silu_mul=True, norm_weight=torch.ones(k, device=DEVICE)
        )
    with pytest.raises(ValueError, match="SPLIT_K at most"):
        kd.dot_rows(x, w, config={"BLOCK_W": 16, "BLOCK_K": 16, "SPLIT_K": 64})


def test_dot_rows_scratch_grows_for_the_32_row_block(monkeypatch):
    """The split partials' scratch is sized for the row block that runs: 16 rows until a step of 17-32 rows
    (the 32-row block, off by default in the engine) first needs more; then that buffer serves every step."""
    monkeypatch.setattr(kd, "_dot_rows_scratch", {})
    n, k = 4200, 16  # 2 * split * 32 * N is past the 16-row buffer's least size (N = 8192)
    w = torch.randn(n, k, device=DEVICE)
    config = {"BLOCK_W": 128, "BLOCK_K": 16, "SPLIT_K": 1}
    split = kd._DOT_ROWS_MAX_SPLIT
    for m, size in ((8, 16 * 8192), (16, 16 * 8192), (20, 32 * 8192), (3, 32 * 8192)):
        x = torch.randn(m, k, device=DEVICE)
        torch.testing.assert_close(kd.dot_rows(x, w, config=config), x @ w.T, atol=1e-4, rtol=1e-4)
        assert kd._dot_rows_scratch[DEVICE][-1][0].numel() == 2 * split * size, m
    assert len(kd._dot_rows_scratch[DEVICE]) == 2
