"""The embedded engine on its fast paths against its reference path, on the committed tiny model:

- the Triton attention backend + fused forward (under Triton's interpreter without CUDA) against SDPA;
- on a GPU: CUDA-graph replay (decode and small-extend shapes, padded) against eager, same engine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tokenrouter.runtime.engine.attention import AttentionConfig
from tokenrouter.runtime.engine.attention.triton_backend import TritonAttnBackend
from tokenrouter.runtime.engine.base import StepInput
from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner
from tokenrouter.runtime.engine.embedded import load_engine
from tokenrouter.runtime.engine.forward_batch import ForwardBatch

TINY = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-small"
CUDA = torch.cuda.is_available()


def script(vocab: int) -> list[list[StepInput]]:
    """Prefill, decodes, a hold, an extend next to a decode, a new request mid-way: a peer-return pattern."""
    g = torch.Generator().manual_seed(5)

    def ids(n):
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    steps = [[StepInput("a", ids(13)), StepInput("b", ids(4))]]
    steps += [[StepInput("a", ids(1)), StepInput("b", ids(1))]]
    steps += [[StepInput("b", ids(1))]]  # a is held
    steps += [[StepInput("b", ids(1)), StepInput("a", ids(5)), StepInput("c", ids(3))]]
    steps += [[StepInput(r, ids(1)) for r in "abc"]]
    return steps


def use_triton(engine) -> None:
    c = engine.model_config
    cfg = AttentionConfig(
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.scaling,
        c.num_hidden_layers,
        engine.dtype,
        engine.device,
    )
    engine.attn_backend = TritonAttnBackend(cfg)
    engine.model.attn_backend = engine.attn_backend


def run(engine, steps):
    return [engine.forward(step, want_hidden=True) for step in steps]


def test_triton_path_matches_sdpa_path():
    device = "cuda" if CUDA else "cpu"
    small = dict(max_tokens=256, max_len=64, max_batch=8)  # the interpreter copies the pools each launch
    ref = load_engine(TINY, device=device, dtype="float32", attention="sdpa", cuda_graph=False, **small)
    fast = load_engine(TINY, device=device, dtype="float32", attention="sdpa", cuda_graph=False, **small)
    use_triton(fast)
    steps = script(ref.info.vocab_size)
    tol = dict(atol=1e-3, rtol=1e-3) if CUDA else dict(atol=1e-4, rtol=1e-4)  # TF32 dots on GPU
    for want, got in zip(run(ref, steps), run(fast, steps), strict=True):
        torch.testing.assert_close(got.logits, want.logits, **tol)
        torch.testing.assert_close(got.hidden, want.hidden, **tol)
    for rid in "abc":
        fast.release(rid)
    assert fast.stats()["pages_free"] == fast.stats()["pages_total"]


class EagerPaddedRunner(CudaGraphRunner):
    """The graph runner's padding and static buffers, with the static batch run eagerly instead of
    replayed: checks the padded layout on any device."""

    def capture(self) -> None:
        self.static = {}
        for bs, q in self.config.shapes():
            self.static[(bs, q)] = self._static_batch(bs, q)

    def _launch(self, shape):  # what a graph runs: the request-table write, then the model
        with torch.inference_mode():
            return self._forward(self.static[shape])


# The (2, 4) shape's three unowned tokens belong to no row: attention leaves their output rows as allocated
# (`torch.empty`), the linear layers carry them, and under the interpreter numpy may warn of an overflow in
# the add & RMSNorm of such a row (in its multiply or its sum of squares, "in reduce", whichever the garbage
# reaches first). They write K/V only to the reserved slot 0 and are dropped before the logits, which the
# assertions compare for every real row.
@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered in reduce:RuntimeWarning")
def test_padded_static_batches_match_unpadded():
    small = dict(max_tokens=256, max_len=64, max_batch=8, device="cuda" if CUDA else "cpu", dtype="float32")
    ref = load_engine(TINY, attention="sdpa", cuda_graph=False, **small)
    fast = load_engine(TINY, attention="sdpa", cuda_graph=False, **small)
    use_triton(fast)
    fast.graph_runner = runner = EagerPaddedRunner(fast, CudaGraphConfig((4,), (2,), (4,)))
    g = torch.Generator().manual_seed(11)

    def ids(n):
        return torch.randint(3, ref.info.vocab_size, (n,), generator=g).tolist()

    steps = [
        [StepInput("a", ids(6)), StepInput("b", ids(3)), StepInput("c", ids(2))],  # q 6 > 4: eager
        [StepInput(r, ids(1)) for r in "abc"],  # decode bs 3 -> (4, 1)
        [StepInput("a", ids(3)), StepInput("b", ids(1))],  # extend bs 2, q 3 -> (2, 4), 3 unowned tokens
        [StepInput("a", ids(1))],  # decode bs 1 -> (4, 1), three padding rows
    ]
    tol = dict(atol=1e-3, rtol=1e-3) if CUDA else dict(atol=1e-4, rtol=1e-4)
    for want, got in zip(run(ref, steps), run(fast, steps), strict=True):
        torch.testing.assert_close(got.logits, want.logits, **tol)
        torch.testing.assert_close(got.hidden, want.hidden, **tol)
    assert runner.replays_by_shape == {(4, 1): 2, (2, 4): 1}


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_graph_replay_matches_eager_gpu(dtype):
    eager = load_engine(TINY, device="cuda", dtype=dtype, cuda_graph=False)
    graphs = load_engine(TINY, device="cuda", dtype=dtype, cuda_graph=True)
    assert graphs.graph_runner is not None and eager.attn_backend.name == "triton"
    runner = graphs.graph_runner
    steps = script(eager.info.vocab_size)
    # plus wide decode and extend batches that land in padded shapes (bs 5 -> 8, 3 tokens -> 4)
    g = torch.Generator().manual_seed(9)
    wide = [StepInput(f"w{i}", torch.randint(3, 500, (20 + i,), generator=g).tolist()) for i in range(5)]
    steps += [wide, [StepInput(f"w{i}", [7]) for i in range(5)]]
    steps += [[StepInput(f"w{i}", [8, 9, 10][: 1 + i % 3]) for i in range(5)]]
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == "bfloat16" else dict(atol=1e-4, rtol=1e-4)
    for step in steps:
        want = eager.forward(step, want_hidden=True)
        got = graphs.forward(step, want_hidden=True)
        torch.testing.assert_close(got.logits.float(), want.logits.float(), **tol)
        torch.testing.assert_close(got.hidden.float(), want.hidden.float(), **tol)
    # decode bs 1, 2, 3 -> 4, padded decode bs 5 -> 8, extends bs 3 x 5 -> (4, 8), bs 5 x 3 -> (8, 4)
    assert {(1, 1), (2, 1), (4, 1), (8, 1), (4, 8), (8, 4)} <= set(runner.replays_by_shape)


def test_one_copy_inputs_load_the_same_static_buffers():
    """The one-copy input load (host staging of the whole step) fills every buffer a captured shape reads
    exactly as the per-tensor copies of a batch without host ints do, padding included, after a larger batch
    left other values."""
    small = dict(max_tokens=256, max_len=64, max_batch=8, device="cuda" if CUDA else "cpu", dtype="float32")
    engine = load_engine(TINY, attention="sdpa", cuda_graph=False, **small)
    use_triton(engine)
    runner = EagerPaddedRunner(engine, CudaGraphConfig((1, 4), (2, 4), (2, 4)))
    pool, r2t = engine.token_to_kv_pool, engine.req_to_token_pool

    def batch(ext, prefix):
        reqs = [r2t.alloc() for _ in ext]
        locs = pool.alloc(sum(ext))
        return ForwardBatch.build(
            input_ids=list(range(3, 3 + sum(ext))),
            out_cache_loc=locs,
            req_pool_indices=reqs,
            extend_prefix_lens=prefix,
            extend_seq_lens=ext,
            device=engine.device,
            req_to_token_pool=r2t,
            token_to_kv_pool=pool,
        )

    cases = [([4, 4, 4, 4], [0, 5, 9, 2]), ([1, 1, 1], [7, 3, 11]), ([3, 1], [2, 6]), ([1], [20])]
    for ext, prefix in cases:
        fb = batch(ext, prefix)
        shape = runner.shape_for(fb)
        cap_bs, cap_q = shape
        got = []
        for one_copy in (True, False):
            runner.inputs.fill_(-7)  # stale values from an earlier, larger step
            runner.load_batch(fb if one_copy else dataclasses.replace(fb, host_ints=None), shape)
            b = runner.max_bs
            used = [runner.tok[:, : cap_bs * cap_q]]
            used += [runner.rows[i * b : i * b + cap_bs] for i in range(4)]
            used += [runner.rows[4 * b : 4 * b + cap_bs + 1], runner.rows[5 * b + 1 : 5 * b + 1 + cap_bs]]
            got.append([u.clone() for u in used])
        for new, old in zip(*got, strict=True):
            assert torch.equal(new, old)
        assert (got[0][0] >= 0).all()  # no stale token values in the shape's buffers


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_the_start_up_block_builds_every_kernel_the_capture_launches(tmp_path, monkeypatch):
    """The start-up's build block runs its forwards over the first two layers only (`layers_to_build`): the
    graphs' capture, over all four layers of tiny-large, then loads no Triton kernel, on an empty Triton cache."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    lines = {}
    engine = load_engine(TINY.parent / "tiny-large", device="cuda", dtype="bfloat16", cuda_graph=True,
                         progress=lambda phase, detail: lines.setdefault(phase, detail))  # fmt: skip
    assert engine.model_config.num_hidden_layers == 4 and engine.ahead.active and engine.ahead.kernels > 0
    assert "CUDA graphs captured" in lines["graphs"] and ", 0 Triton kernel load(s)" in lines["graphs"]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_after_the_start_no_eager_step_loads_an_attention_kernel(tmp_path, monkeypatch):
    """The start (the build block and `warm_eager`) covers every attention variant an eager step can make
    (`EagerWarmUp._attention_variant_shapes`): steps of one long row beside 2-23 decodes, after it, load no
    Triton attention kernel on an empty Triton cache (a 0.6B step of 5 rows and 70 new tokens once built one
    in a served step on an H100)."""
    from tokenrouter.runtime.engine import kernel_loads

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(kernel_loads, "RECENT", 1000)  # every name
    engine = load_engine(TINY.parent / "tiny-large", device="cuda", dtype="bfloat16", cuda_graph=True,
                         max_batch=24, max_len=600)  # fmt: skip
    engine.warm_eager()
    before = kernel_loads.LOADS.snapshot()
    shapes = [(n, *(1,) * (b - 1)) for b in (3, 5, 6, 9, 17, 24) for n in (40, 70, 97, 130, 300, 520)]
    for k, shape in enumerate(shapes):  # each on throwaway requests, as the warm-up's own steps
        engine._warm_step(k, shape, len(shapes), False)
    torch.cuda.synchronize()
    loads, _, names = kernel_loads.LOADS.since(before)
    print(f"after the start: {loads} Triton kernel load(s) {names}")
    assert not [n for n in names if "attn" in n], names
