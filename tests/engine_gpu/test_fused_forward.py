"""The fused decoder forward of the Triton path against the model's own forward on the SDPA backend,
for tiny random Qwen3 (q/k norm), Qwen2 (qkv bias) and Llama models: prefill, a mixed extend/decode
step, a one-token step (which runs the linear layers as the Triton GEMV, with add & RMSNorm folded
into the GEMVs or not), steps of 2-8 tokens (the few-row GEMV `gemv_rows`, or cuBLAS with it off), of 13 and
18 tokens (the tensor-core `dot_rows`, 16- and 32-row blocks) and one of 34 tokens (cuBLAS)."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.runtime.engine.attention import AttentionConfig, SdpaAttnBackend
from tokenrouter.runtime.engine.attention.triton_backend import (
    ATTN_SPLIT_ROWS,
    DOT_ROWS_DECODE_MAX,
    DOT_ROWS_NARROW_MAX,
    FAST_PATH_OPTIONS,
    GEMV_ROWS_BATCH_MAX,
    GEMV_ROWS_MAX,
    TritonAttnBackend,
    fused_decoder_forward,
)
from tokenrouter.runtime.engine.config import EngineTuning, ModelConfig
from tokenrouter.runtime.engine.forward_batch import ForwardBatch
from tokenrouter.runtime.engine.kernels import attention as ka
from tokenrouter.runtime.engine.kernels import attention_shapes as ks
from tokenrouter.runtime.engine.kernels import dot_rows as kd
from tokenrouter.runtime.engine.kernels import elementwise as ke
from tokenrouter.runtime.engine.kernels import linear as kl
from tokenrouter.runtime.engine.memory_pool import MHATokenToKVPool, ReqToTokenPool
from tokenrouter.runtime.engine.models.decoder import DecoderForCausalLM

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def tiny_model(family: str, seed: int = 0) -> DecoderForCausalLM:
    cfg = ModelConfig(
        family=family,
        architecture=family,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=50,
        max_position_embeddings=128,
        tie_word_embeddings=family == "qwen3",
        qk_norm=family == "qwen3",
        qkv_bias=family == "qwen2",
    )
    torch.manual_seed(seed)
    model = DecoderForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3 if p.dim() > 1 else 1.0)
    model.to(DEVICE)
    model.post_load(DEVICE)
    return model


def attn_config(cfg: ModelConfig, **tuning) -> AttentionConfig:
    """The tiny model's attention config, with `EngineTuning(**tuning)`."""
    return AttentionConfig(
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.scaling,
        cfg.num_hidden_layers,
        torch.float32,
        DEVICE,
        tuning=EngineTuning(**tuning),
    )


def run_steps(model, backend, forward, steps, reqs: int = 8):
    """Run `steps` (lists of (row, new_ids)) on fresh pools of `reqs` requests; returns the logits of every
    step."""
    cfg = model.config
    r2t = ReqToTokenPool(reqs, 64, DEVICE)
    pool = MHATokenToKVPool(
        256, torch.float32, cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers, DEVICE
    )
    model.attn_backend = backend
    rows: dict[int, tuple[int, int]] = {}  # row -> (req index, length)
    out = []
    for step in steps:
        ids, req, prefix, ext, locs = [], [], [], [], []
        for row, new in step:
            if row not in rows:
                rows[row] = (r2t.alloc(), 0)
            r, n = rows[row]
            slots = pool.alloc(len(new))
            r2t.write(r, n, slots)
            rows[row] = (r, n + len(new))
            ids += new
            req.append(r)
            prefix.append(n)
            ext.append(len(new))
            locs.append(slots)
        fb = ForwardBatch.build(
            input_ids=ids,
            out_cache_loc=torch.cat(locs),
            req_pool_indices=req,
            extend_prefix_lens=prefix,
            extend_seq_lens=ext,
            device=DEVICE,
            req_to_token_pool=r2t,
            token_to_kv_pool=pool,
        )
        backend.init_forward_metadata(fb)
        with torch.inference_mode():
            out.append(forward(fb))
    return out


STEPS = [
    [(0, [1, 2, 3, 4, 5]), (1, [7, 8, 9])],  # 8 tokens
    [(0, [6]), (1, [10, 11, 12]), (2, [3, 3])],  # 6
    [(1, [4])],  # one token: the GEMV path
    [(2, [7, 8])],  # 2
    [(0, list(range(13, 25))), (2, [5])],  # 13: more than gemv_rows_max: dot_rows (cuBLAS with it off)
    [(0, list(range(30, 47))), (1, [6])],  # 18: dot_rows' 32-row block (with dot_rows_max 32; else cuBLAS)
    [(3, list(range(1, 34))), (1, [6])],  # 34: more than dot_rows_max, cuBLAS
]
KERNELS = ("gemv", "gemv_rows", "dot_rows", "rmsnorm")


def kernel_module(name: str):
    """The kernels module that defines one of KERNELS."""
    return ke if name == "rmsnorm" else kd if name == "dot_rows" else kl


def counted_fused_forward(model, monkeypatch):
    """(calls, forward): `fused_decoder_forward` for `model` that appends, per step, a dict of how many
    times each of KERNELS was launched."""
    calls: list[dict[str, int]] = []  # per step: launches of each kernel

    def counted(name):
        real = getattr(kernel_module(name), name)

        def wrapper(*a, **k):
            calls[-1][name] += 1
            return real(*a, **k)

        return wrapper

    for name in KERNELS:
        monkeypatch.setattr(kernel_module(name), name, counted(name))

    def forward(fb):
        calls.append(dict.fromkeys(KERNELS, 0))
        return fused_decoder_forward(model, fb)

    return calls, forward


ROWS = {8: "gemv_rows", 1: "gemv_rows_bs1", 0: "no_gemv_rows"}
FOLD = {True: "gemv_norm", False: "no_gemv_norm"}
# Every kernel variant (the linear kernels with and without the folded norm, bias and SiLU * up) runs in
# the Qwen2 model (bias on q/k/v only), so it takes every switch combination; the other families differ
# elsewhere (Qwen3's q/k norm and tied embeddings, Llama's neither) and take one combination each.
COMBOS = [("qwen2", fold, rows) for fold in FOLD for rows in ROWS] + [("qwen3", True, 8), ("llama", False, 0)]


@pytest.mark.parametrize(
    "family,fold,rows", COMBOS, ids=[f"{fam}-{FOLD[fold]}-{ROWS[rows]}" for fam, fold, rows in COMBOS]
)
def test_fused_forward_matches_model_forward(family, fold, rows, monkeypatch):
    model = tiny_model(family)
    cfg = attn_config(model.config)
    want = run_steps(model, SdpaAttnBackend(cfg), model.forward, STEPS)
    backend = TritonAttnBackend(cfg)
    backend.gemv_norm = fold
    backend.dot_rows_norm_max = kd.DOT_ROWS_LIMIT if fold else 0  # dot_rows' fold too (by default: see below)
    # the defaults: steps of 2 tokens, models of hidden size <= 2048 (the tiny one's is 64)
    assert (backend.gemv_rows_max, backend.gemv_rows_batch_max, backend.small_hidden_max) == (2, 2, 2048)
    backend.gemv_rows = rows > 0
    backend.gemv_rows_max = 8  # every few-row step of STEPS (the kernel's limit)
    backend.gemv_rows_batch_max = rows  # requests per step (8: no further limit)
    backend.dot_rows_max = kd.DOT_ROWS_LIMIT  # 32: the 18-token step on the 32-row block (no tuned tiles: 16)
    calls, forward = counted_fused_forward(model, monkeypatch)
    got = run_steps(model, backend, forward, STEPS)
    layers = model.config.num_hidden_layers
    for step, counts in zip(STEPS, calls, strict=True):
        tokens = sum(len(new) for _, new in step)
        few = 2 <= tokens <= 8 and len(step) <= rows
        assert counts["gemv"] == (4 * layers if tokens == 1 else 0), (tokens, counts)
        assert counts["gemv_rows"] == (4 * layers if few else 0), (tokens, counts)
        dot = 2 <= tokens <= 32 and not few  # the tensor-core kernel takes the other steps of up to 32 tokens
        assert counts["dot_rows"] == (4 * layers if dot else 0), (tokens, counts)
        # folded: only the final norm is its own launch; else the input norm and two add & norms per layer
        folded = fold and (tokens == 1 or few or dot)
        assert counts["rmsnorm"] == (1 if folded else 1 + 2 * layers), (tokens, counts)
    for (wl, wh), (gl, gh) in zip(want, got, strict=True):
        torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)


def test_large_models_run_unfolded_on_cublas(monkeypatch):
    """Above `small_hidden_max` neither the few-row GEMV nor the folded norm acts (the H200 measured both
    slower at the 8B); one-token steps keep the GEMV; the logits are the model's."""
    model = tiny_model("qwen3")
    cfg = attn_config(model.config)
    want = run_steps(model, SdpaAttnBackend(cfg), model.forward, STEPS)
    backend = TritonAttnBackend(cfg)
    backend.small_hidden_max = model.config.hidden_size - 1
    backend.gemv_rows_max, backend.gemv_rows_batch_max = 8, 8
    calls, forward = counted_fused_forward(model, monkeypatch)
    got = run_steps(model, backend, forward, STEPS)
    layers = model.config.num_hidden_layers
    for step, counts in zip(STEPS, calls, strict=True):
        tokens = sum(len(new) for _, new in step)
        assert counts["gemv"] == (4 * layers if tokens == 1 else 0), (tokens, counts)
        assert counts["gemv_rows"] == counts["dot_rows"] == 0, (tokens, counts)
        assert counts["rmsnorm"] == 1 + 2 * layers, (tokens, counts)
    for (wl, wh), (gl, gh) in zip(want, got, strict=True):
        torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("fused_merge", [True, False], ids=["fused_merge", "merge_kernel"])
def test_fused_forward_with_split_kv(fused_merge, monkeypatch):
    """Split-KV attention in every layer (as on a GPU with more SMs than a step has programs: 16 here, which
    splits every step's KV in 2-8 parts; the interpreter runs each split's program in turn), its partials
    merged in the attention kernel (by ticket) or by the merge kernel: the same steps."""
    monkeypatch.setattr(ks, "num_sms", lambda device: 16)
    model = tiny_model("qwen3")
    cfg = attn_config(model.config)
    want = run_steps(model, SdpaAttnBackend(cfg), model.forward, STEPS)
    backend = TritonAttnBackend(cfg)
    backend.fused_merge = fused_merge
    assert backend.metadata_for(1, 1).num_splits > 1
    got = run_steps(model, backend, lambda fb: fused_decoder_forward(model, fb), STEPS)
    for (wl, wh), (gl, gh) in zip(want, got, strict=True):
        torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)
    assert not backend.metadata_for(1, 1).tickets.any()  # left at zero for the next launch


def test_dot_rows_off_runs_cublas(monkeypatch):
    """With `dot_rows` off the steps it would take run on cuBLAS; the same logits either way."""
    model = tiny_model("qwen3")
    cfg = attn_config(model.config)
    want = run_steps(model, SdpaAttnBackend(cfg), model.forward, STEPS)
    backend = TritonAttnBackend(cfg)
    # no tuned 32-row tiles for the CPU: the 16-row block's reach
    assert (
        (backend.dot_rows_max, backend.dot_rows_decode_max)
        == (DOT_ROWS_NARROW_MAX, DOT_ROWS_DECODE_MAX)
        == (16, 16)
    )
    backend.dot_rows = False
    calls, forward = counted_fused_forward(model, monkeypatch)
    got = run_steps(model, backend, forward, STEPS)
    assert all(counts["dot_rows"] == 0 for counts in calls)
    for (wl, wh), (gl, gh) in zip(want, got, strict=True):
        torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)


def test_dot_rows_decodes_have_their_own_reach(monkeypatch):
    """`dot_rows_decode_max` (default 16) bounds the rows of a decode step (one new token per row) on
    dot_rows, apart from `dot_rows_max`: the H200 measured the 32-row block slower than cuBLAS at decode bs
    32 and faster at extends of 17-32 tokens. The same logits either way."""
    model = tiny_model("qwen3")
    cfg = attn_config(model.config)
    decode = [(row, [row + 1]) for row in range(18)]  # 18 rows, one new token each
    steps = [decode, [(0, list(range(30, 47))), (1, [6])], [(row, [row + 2]) for row in range(12)]]
    want = run_steps(model, SdpaAttnBackend(cfg), model.forward, steps, reqs=18)
    backend = TritonAttnBackend(cfg)
    backend.dot_rows_max, backend.dot_rows_decode_max = kd.DOT_ROWS_LIMIT, DOT_ROWS_DECODE_MAX
    calls, forward = counted_fused_forward(model, monkeypatch)
    got = run_steps(model, backend, forward, steps, reqs=18)
    layers = model.config.num_hidden_layers
    # the 18-row decode on cuBLAS, the 18-token extend and the 12-row decode on dot_rows
    assert [c["dot_rows"] for c in calls] == [0, 4 * layers, 4 * layers]
    for (wl, wh), (gl, gh) in zip(want, got, strict=True):
        torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)


def test_dot_rows_fold_their_norm_up_to_dot_rows_norm_max(monkeypatch):
    """`dot_rows_norm_max` (the row blocks whose folded tiles the tuned tables hold; none on the CPU): dot_rows
    steps of up to that many tokens fold add & RMSNorm, longer ones launch it."""
    model = tiny_model("qwen3")
    cfg = attn_config(model.config)
    steps = [STEPS[4], STEPS[5]]  # 13 tokens (16-row block), 18 (32-row block)
    want = run_steps(model, SdpaAttnBackend(cfg), model.forward, steps)
    backend = TritonAttnBackend(cfg)
    assert backend.dot_rows_norm_max == 0
    backend.dot_rows_max, backend.dot_rows_norm_max = kd.DOT_ROWS_LIMIT, 16
    calls, forward = counted_fused_forward(model, monkeypatch)
    got = run_steps(model, backend, forward, steps)
    layers = model.config.num_hidden_layers
    assert [c["dot_rows"] for c in calls] == [4 * layers] * 2
    assert [c["rmsnorm"] for c in calls] == [1, 1 + 2 * layers]  # folded, then launched
    for (wl, wh), (gl, gh) in zip(want, got, strict=True):
        torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)


def test_dot_rows_steps_launch_their_norms_by_default(monkeypatch):
    """By default (no tuned folded tiles, as on the CPU) a dot_rows step launches the input norm and two add &
    norms per layer, a one-token step folds them; with `dot_rows_norm_max` raised the dot_rows steps fold
    too, and with dot_prefetch (on by default) off as well the logits stay the same."""
    model = tiny_model("qwen3")
    cfg = attn_config(model.config)
    want = run_steps(model, SdpaAttnBackend(cfg), model.forward, STEPS[2:5])
    layers = model.config.num_hidden_layers
    cases = ((0, True, 1 + 2 * layers), (kd.DOT_ROWS_LIMIT, True, 1), (kd.DOT_ROWS_LIMIT, False, 1))
    for norm_max, prefetch, dot_norms in cases:
        backend = TritonAttnBackend(cfg)
        assert backend.gemv_norm and backend.dot_prefetch and backend.dot_rows_norm_max == 0
        backend.dot_rows_norm_max, backend.dot_prefetch = norm_max, prefetch
        calls, forward = counted_fused_forward(model, monkeypatch)
        got = run_steps(model, backend, forward, STEPS[2:5])  # 1 token, 2 (gemv_rows), 13 (dot_rows)
        assert [c["rmsnorm"] for c in calls] == [1, 1, dot_norms]
        assert calls[2]["dot_rows"] == 4 * layers
        for (wl, wh), (gl, gh) in zip(want, got, strict=True):
            torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
            torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)


def test_dot_rows_reach_from_the_tuning():
    model_cfg = tiny_model("qwen3").config
    backend = TritonAttnBackend(attn_config(model_cfg))  # no tuned 32-row tiles here: 16
    assert (backend.dot_rows_max, backend.dot_rows_decode_max) == (DOT_ROWS_NARROW_MAX, DOT_ROWS_DECODE_MAX)
    backend = TritonAttnBackend(attn_config(model_cfg, dot_rows_max=8, dot_rows_decode_max=8))
    assert (backend.dot_rows_max, backend.dot_rows_decode_max) == (8, 8)
    backend = TritonAttnBackend(attn_config(model_cfg, dot_rows_max=32, dot_rows_decode_max=12))
    assert (backend.dot_rows_max, backend.dot_rows_decode_max) == (32, 12)


def test_fused_merge_rows_from_the_tuning(monkeypatch):
    """`fused_merge_rows` 16: the extends' 16-row blocks merge their splits in the attention kernel
    too; the same steps, the tickets left at zero."""
    monkeypatch.setattr(ks, "num_sms", lambda device: 132)
    model = tiny_model("qwen3")
    cfg = attn_config(model.config)
    want = run_steps(model, SdpaAttnBackend(cfg), model.forward, STEPS[:-1])  # the last splits no KV
    assert TritonAttnBackend(cfg).fused_merge_rows == ks.FUSED_MERGE_MAX_ROWS == 4
    backend = TritonAttnBackend(attn_config(model.config, fused_merge_rows=16))
    assert backend.fused_merge_rows == 16
    merges = []  # the second kernel's launches: (step, grid)

    class Counted:
        def __getitem__(self, grid):
            merges.append((len(got), grid))
            return real[grid]

    real, got = ka._merge_splits_kernel, []
    monkeypatch.setattr(ka, "_merge_splits_kernel", Counted())

    def forward(fb):
        got.append(None)
        return fused_decoder_forward(model, fb)

    got = run_steps(model, backend, forward, STEPS[:-1])
    # only the steps with blocks of more than 16 rows (13, 18 and 34 tokens, GQA 2) merge in a second kernel
    group = cfg.num_heads // cfg.num_kv_heads
    wide = {i + 1 for i, step in enumerate(STEPS[:-1]) if max(len(new) for _, new in step) * group > 16}
    assert {i for i, _ in merges} == wide and wide, (merges, wide)
    for (wl, wh), (gl, gh) in zip(want, got, strict=True):
        torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)
    assert not backend.metadata_for(1, 8).tickets.any()
    assert (backend.fused_merge_rows, backend.fused_merge_passes) == (16, 1)
    backend = TritonAttnBackend(attn_config(model.config, fused_merge_rows=4, fused_merge_passes=2))
    assert (backend.fused_merge_rows, backend.fused_merge_passes) == (4, 2)
    # 4 rows, 2 passes: blocks merged in at most two passes fold too; at this model's 64 splits and head_dim 16 a pass
    # takes 8 rows, so the blocks of up to 16 rows fold (as with 16 rows) and those of 26 and 36 rows do not
    merges.clear()
    got = []
    got = run_steps(model, backend, forward, STEPS[:-1])
    assert {i for i, _ in merges} == wide, (merges, wide)
    for (wl, wh), (gl, gh) in zip(want, got, strict=True):
        torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)


def test_attn_split_rows_from_the_tuning(monkeypatch):
    """By default (256 rows) the 34-token extend (68 rows at GQA 2) may split its KV range;
    `attn_split_rows` 64, the rule before, runs it unsplit; the logits are the reference's both ways. (16 SMs
    split it in 2.)"""
    monkeypatch.setattr(ks, "num_sms", lambda device: 16)
    model = tiny_model("qwen3")
    cfg = attn_config(model.config)
    group = cfg.num_heads // cfg.num_kv_heads
    want = run_steps(model, SdpaAttnBackend(cfg), model.forward, STEPS)
    asked = []  # (query rows, KV splits) per attention launch
    real = ka.paged_attention

    def recorded(*args, **kwargs):
        asked.append((kwargs["max_extend_len"] * group, kwargs["num_splits"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(ka, "paged_attention", recorded)
    for limit in (ATTN_SPLIT_ROWS, 64):
        backend = TritonAttnBackend(attn_config(model.config, attn_split_rows=limit))
        backend.fused_ops = False  # the model's own forward: the attention is the Triton kernel that matters
        assert backend.attn_split_rows == limit
        asked.clear()
        got = run_steps(model, backend, model.forward, STEPS)
        wide = {splits for rows, splits in asked if rows > 64}
        assert 34 * group > 64 and wide == ({1} if limit == 64 else {s for s in wide if s > 1}) and wide, (
            asked
        )
        for (wl, wh), (gl, gh) in zip(want, got, strict=True):
            torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
            torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)


def test_attention_prefetch_is_for_decodes_only(monkeypatch):
    """`attn_prefetch` asks the attention kernel for its early reads at one-token launches (of up to
    `attn_decode_single_stage_bs` requests: this test's decodes have one) and not at extends (on the H200 they were
    faster without them), unless `attn_prefetch_max` is raised; off, at none. The logits stay the reference's:
    on the fused forward at the defaults, on the model's own forward at the other settings (`fused_ops` off:
    its only Triton kernels are the K/V store and the attention, options picked by the backend either way)."""
    model = tiny_model("qwen3")
    cfg = attn_config(model.config)
    want = run_steps(model, SdpaAttnBackend(cfg), model.forward, STEPS)
    asked = []  # (largest new tokens per row, prefetch) per attention launch
    real = ka.paged_attention

    def recorded(*args, **kwargs):
        asked.append((kwargs["max_extend_len"], kwargs["prefetch"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(ka, "paged_attention", recorded)
    backend = TritonAttnBackend(cfg)
    got = run_steps(model, backend, lambda fb: fused_decoder_forward(model, fb), STEPS)
    assert {q for q, _ in asked} >= {1, 5, 17} and all(p == (q == 1) for q, p in asked), asked
    for (wl, wh), (gl, gh) in zip(want, got, strict=True):
        torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)
    asked.clear()
    backend.fused_ops = False
    backend.attn_prefetch_max = 5
    got = run_steps(model, backend, model.forward, STEPS)
    assert {q for q, _ in asked} >= {1, 5, 17} and all(p == (q <= 5) for q, p in asked), asked
    for (wl, wh), (gl, gh) in zip(want, got, strict=True):
        torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)
    asked.clear()
    backend.attn_prefetch = False
    run_steps(model, backend, model.forward, STEPS[2:4])
    assert asked and not any(p for _, p in asked)


def record_attention(monkeypatch, model, backend, keys: tuple[str, ...]):
    """launches(fused=False): run three decodes (bs 1, 3, 2) and STEPS on `backend`, check every step's logits
    against the reference's (SDPA), and return the set of (batch size, max_extend_len, *the launch options
    `keys`) that `ka.paged_attention` was called with; from now on it records every call.

    With `fused` the steps run `fused_decoder_forward`, every Triton kernel interpreted (about 17 s on the
    CPU); else the model's own forward (`fused_ops` off), whose only Triton kernels are the K/V store and the
    attention (about 2 s). Both launch the attention kernel through `backend.attend`, with the options that
    the backend derives from the step's shape (`init_forward_metadata`: batch size and max_extend_len), never
    from a tensor's values; so the same steps record the same launches on either forward (checked where the
    tests run both), and the interpreted kernel computes the logits with those options on either."""
    asked = []
    real = ka.paged_attention

    def recorded(*args, **kwargs):
        bs = args[6].shape[0]  # seq_lens
        asked.append((bs, kwargs["max_extend_len"], *(kwargs[k] for k in keys)))
        return real(*args, **kwargs)

    decodes = [[(0, [1])], [(0, [2]), (1, [3]), (2, [4])], [(0, [5]), (1, [6])]]  # bs 1, 3, 2
    steps = decodes + STEPS
    want = run_steps(model, SdpaAttnBackend(attn_config(model.config)), model.forward, steps)
    monkeypatch.setattr(ka, "paged_attention", recorded)

    def launches(fused: bool = False) -> set[tuple]:
        asked.clear()
        backend.fused_ops = fused
        got = run_steps(model, backend, model.forward, steps)
        for (wl, wh), (gl, gh) in zip(want, got, strict=True):
            torch.testing.assert_close(gh, wh, atol=2e-4, rtol=2e-4)
            torch.testing.assert_close(gl, wl, atol=2e-4, rtol=2e-4)
        return set(asked)

    return launches


def test_attention_stages_and_early_reads_by_step_kind(monkeypatch):
    """Decodes of up to `attn_decode_single_stage_bs` requests (default 1) read their first KV tile early and run
    the KV loop unpipelined (1 stage); larger decodes run it pipelined without early reads (faster), as do extends
    (unpipelined only for row blocks of up to `attn_extend_single_stage_rows` query rows: by default none).
    Pipelined means 2 stages, 3 for 32-row blocks; with `attn_stages` off, 2 everywhere. Logits unchanged:
    on the fused forward at the defaults, on the model's own forward (the same launches) at every setting.
    (The KV tiles, which set 2 stages where they widen or narrow the tile, are off here: see the next
    test.)"""
    model = tiny_model("qwen3")
    cfg = attn_config(model.config)
    group = cfg.num_heads // cfg.num_kv_heads
    backend = TritonAttnBackend(cfg)
    backend.attn_tiles = False
    # (batch size, largest new tokens per row, stages, early reads) per attention launch
    launches = record_attention(monkeypatch, model, backend, ("num_stages", "prefetch"))

    def pipelined(q: int) -> int:
        return 3 if 16 < q * group <= 32 else 2

    assert (backend.attn_decode_single_stage_bs, backend.attn_extend_single_stage_rows) == (1, 0)
    got = launches(fused=True)
    shapes = {(b, q) for b, q, _, _ in got}
    assert shapes >= {(1, 1), (2, 1), (3, 1), (2, 5), (2, 17)}, got
    assert got == {(b, q, 1, True) if q == 1 and b <= 1 else (b, q, pipelined(q), False) for b, q in shapes}
    assert launches() == got  # the model's own forward launches the attention as the fused one does
    backend.attn_decode_single_stage_bs = 2  # bs 2 reads early too
    assert launches() == {
        (b, q, 1, True) if q == 1 and b <= 2 else (b, q, pipelined(q), False) for b, q in shapes
    }
    backend.attn_decode_single_stage_bs = 16  # bs 3 reads early too
    assert launches() == {(b, q, 1, True) if q == 1 else (b, q, pipelined(q), False) for b, q in shapes}
    backend.attn_extend_single_stage_rows = 8  # the extends' earlier rule: row blocks of up to 8 rows
    assert launches() == {
        (b, q, 1, True) if q == 1 else (b, q, 1 if q * group <= 8 else pipelined(q), False) for b, q in shapes
    }
    backend.attn_stages = False
    assert {s for _, _, s, _ in launches()} == {2}


def test_attention_kv_tiles_by_split_count(monkeypatch):
    """Launches of at most `attn_wide_tile_splits` KV splits (default 4) whose grid fits two programs per SM run
    128-token KV tiles, launches of at least `attn_narrow_tile_splits` (default 32) 32-token ones, both with 2
    stages; decodes that read early, row blocks of more than 32 query rows and `attn_tiles` off keep the
    kernel's tile (None). The logits stay the reference's with every tile: on the fused forward at the
    defaults, on the model's own forward (the same launches: see the previous test) at the other settings. The
    GPU's SM count is set to 8 here, so that this tiny model's few requests reach split counts of 1-4 (and,
    with the thresholds moved, both kinds of tile)."""
    model = tiny_model("qwen3")
    cfg = attn_config(model.config)
    group = cfg.num_heads // cfg.num_kv_heads
    monkeypatch.setattr(ks, "num_sms", lambda device: 8)
    backend = TritonAttnBackend(cfg)
    # (batch size, largest new tokens per row, splits, KV tile, stages, early reads) per attention launch
    launches = record_attention(
        monkeypatch, model, backend, ("num_splits", "block_n", "num_stages", "prefetch")
    )

    def splits(b: int, q: int) -> int:  # choose_num_splits at 8 SMs (one row block up to 32 rows)
        return (
            1 if q * group > 64 else max(1, min(64, 1 << (-(-8 // (b * cfg.num_kv_heads)) - 1).bit_length()))
        )

    assert (backend.attn_wide_tile_splits, backend.attn_narrow_tile_splits) == (4, 32)
    got = launches(fused=True)
    shapes = {(b, q) for b, q, *_ in got}
    assert shapes >= {(1, 1), (2, 1), (3, 1), (1, 2), (2, 5), (2, 17)}, got
    assert all(s == splits(b, q) for b, q, s, *_ in got), got
    early = {(1, 1)}  # the one decode that reads early: the kernel's tile, one stage

    def expected(b: int, q: int, tile) -> tuple:
        if (b, q) in early:
            return (b, q, splits(b, q), None, 1, True)
        if q * group > 32:  # not swept: the kernel's tile, the stage rule
            return (b, q, splits(b, q), None, 2, False)
        return (b, q, splits(b, q), tile(splits(b, q)), 2, False)

    # every split count here is at most 4 and every grid at most 16 programs: the wide tile
    assert got == {expected(b, q, lambda s: 128) for b, q in shapes}, got
    backend.attn_wide_tile_splits, backend.attn_narrow_tile_splits = (
        2,
        4,
    )  # bs 1: 4 splits, narrow; bs 2-3: wide
    assert launches() == {expected(b, q, lambda s: 32 if s >= 4 else 128) for b, q in shapes}
    backend.attn_tiles = False
    assert {t for _, _, _, t, _, _ in launches()} == {None}


def test_every_fast_path_part_is_on_by_default():
    backend = TritonAttnBackend(attn_config(tiny_model("qwen3").config))
    assert backend.options() == dict.fromkeys(FAST_PATH_OPTIONS, True)
    assert backend.tuned_tiles and backend.pdl  # EngineTuning's defaults


def test_gemv_rows_reach_from_the_tuning():
    model_cfg = tiny_model("qwen3").config
    backend = TritonAttnBackend(attn_config(model_cfg))
    assert (backend.gemv_rows_batch_max, backend.gemv_rows_max) == (GEMV_ROWS_BATCH_MAX, GEMV_ROWS_MAX)
    backend = TritonAttnBackend(attn_config(model_cfg, gemv_rows_batch_max=1, gemv_rows_max=4))
    assert (backend.gemv_rows_batch_max, backend.gemv_rows_max) == (1, 4)
    backend = TritonAttnBackend(attn_config(model_cfg, gemv_rows_max=8))  # up to the kernel's limit, 8 rows
    assert (backend.gemv_rows_batch_max, backend.gemv_rows_max) == (2, 8)


def test_autotuners_keep_their_results_on_disk():
    """The linear kernels' autotuners keep their results on disk (checked in a fresh interpreter without
    TRITON_INTERPRET, where the autotuners exist)."""
    import os
    import subprocess
    import sys

    probe = (
        "from tokenrouter.runtime.engine.kernels import dot_rows as kd, linear as kl;"
        "print([a.cache_results for a in (kl._gemv, kl._gemv_base, kd._dot_rows, *kl._gemv_few.values())])"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_CACHE_AUTOTUNING")}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repr([True] * 6), (out.stdout, out.stderr)
