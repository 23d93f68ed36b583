"""`EmbeddedEngine.warm_eager`: at start, one step of each kind that no captured CUDA graph holds, on throwaway
requests, so that the Triton kernels such a step needs are built then rather than in a served step (on a fresh
H200: 1227 ms for the 32B's first 93-token extend, about 64 once built). On CPU there are no graphs; the tests
give the engine the real runner's bucket lookup (`CudaGraphRunner.bucket`) over the default configuration, and
every step runs eagerly."""

from pathlib import Path

import pytest

from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner
from tokenrouter.runtime.engine.eager_warm import WARM_MAX_TOKENS
from tokenrouter.runtime.engine.embedded import load_engine
from tokenrouter.runtime.prefix_cache import PrefixCachingEngine

TINY_SMALL = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-small"


def buckets(config: CudaGraphConfig | None = None) -> CudaGraphRunner:
    """A runner with the buckets of `config` and nothing captured (its `bucket` only)."""
    config = config or CudaGraphConfig()
    runner = CudaGraphRunner.__new__(CudaGraphRunner)
    runner.config = config
    runner._init_buckets()
    return runner


def held_by_graphs(engine, shape: tuple[int, ...]) -> bool:
    return engine.graph_runner.bucket(len(shape), max(shape)) is not None


def test_without_graphs_there_is_nothing_to_warm():
    engine = load_engine(TINY_SMALL)
    assert engine.graph_runner is None
    assert engine.eager_warm_shapes() == [] and engine.warm_eager() == 0


def test_the_shapes_are_the_kinds_no_graph_holds():
    engine = load_engine(TINY_SMALL)
    engine.graph_runner = buckets()
    shapes = engine.eager_warm_shapes()
    assert shapes and not any(held_by_graphs(engine, s) for s in shapes)
    assert max(sum(s) for s in shapes) <= WARM_MAX_TOKENS
    longest = max(q for _, q in engine.graph_runner.extend_shapes)  # 64
    long = [s for s in shapes if max(s) > longest]
    # a long row alone and beside short rows; token counts both multiples of 16 and not
    assert {len(s) == 1 for s in long} == {True, False}
    assert {sum(s) % 16 == 0 for s in long} == {True, False}
    wide = [s for s in shapes if 1 < max(s) <= longest]  # more returning rows than the extend graphs hold
    assert wide and min(len(s) for s in wide) == 17 and max(len(s) for s in wide) > 64  # 2-16 tokens a row
    assert {max(s) for s in wide} == {2, 3, 4, 8, 16, 32, 64}
    # odd and even batch sizes and token counts (the packed inputs' alignment), for each kind
    for kind in (long, wide):
        assert {(len(s) % 2, sum(s) % 2) for s in kind} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert any(max(s) == 1 and len(s) > 64 for s in shapes)  # a decode wider than the widest graph
    # a custom configuration moves the kinds with it: extends of up to 128 tokens captured
    engine.graph_runner = buckets(CudaGraphConfig(extend_lens=(2, 8, 32, 128), max_extend_tokens=2048))
    assert min(max(s) for s in engine.eager_warm_shapes() if len(s) <= 3) > 128
    # only what the engine can run: rows within max_batch, prompts within max_len
    small = load_engine(TINY_SMALL, max_batch=20, max_len=90)
    small.graph_runner = buckets()
    got = small.eager_warm_shapes()
    assert got and all(len(s) <= 20 and max(s) <= 89 for s in got)
    assert len(got) < len(shapes)


@pytest.mark.parametrize("engine_class", [None, PrefixCachingEngine])
def test_warm_up_runs_each_shape_once_and_leaves_the_engine_as_it_was(engine_class):
    engine = load_engine(TINY_SMALL, engine_class=engine_class)
    engine.graph_runner = buckets()
    ran = []
    run_model = engine._run_model

    def spy(fb):
        ran.append((fb.batch_size, fb.max_extend_len, fb.num_tokens))
        return run_model(fb)

    engine._run_model = spy
    before = engine.stats()
    shapes = engine.eager_warm_shapes()
    assert engine.warm_eager() == len(shapes)
    assert ran == [(len(s), max(s), sum(s)) for s in shapes]
    assert engine.stats() == before  # every page and request row free, no step counted, no prefix cached


def test_a_warm_up_is_logged_with_the_kernels_it_loaded(caplog):
    """`loading.warmed`, which logs both warm-ups (the eager steps and the route kernel): the count it made and
    the Triton kernel loads meanwhile (none on CPU); nothing where it made none."""
    import logging

    from tokenrouter.runtime.subserver.loading import warmed

    with caplog.at_level(logging.INFO, logger="tokenrouter.runtime.subserver.loading"):
        warmed("slm", "eager steps warmed (kinds no CUDA graph holds)", "steps", lambda: 14)
        warmed("llm", "route kernel warmed for steps of up to 8 rows", "launches", lambda: 0)
    got = [r.getMessage() for r in caplog.records]
    assert len(got) == 1
    assert got[0].startswith(
        "model slm: eager steps warmed (kinds no CUDA graph holds): 14 steps, 0 Triton kernel"
    )


def test_at_debug_level_each_warm_up_step_is_logged(caplog):
    """At debug level (`serve --log-level debug`) each step of the warm-up logs its shape and time, with the
    device allocator's work in it (zeros on CPU): how 54-67 s starts of a 0.6B + 32B server were taken apart."""
    import logging

    engine = load_engine(TINY_SMALL)
    engine.graph_runner = buckets()
    shapes = engine.eager_warm_shapes()
    with caplog.at_level(logging.DEBUG, logger="tokenrouter.runtime.engine.eager_warm"):
        engine.warm_eager()
    got = [r.getMessage() for r in caplog.records if "warm-up step" in r.getMessage()]
    assert len(got) == len(shapes)
    s = shapes[-1]
    assert got[-1].startswith(
        f"eager warm-up step {len(shapes)}/{len(shapes)}: {len(s)} rows, {sum(s)} new tokens"
    )
    assert got[-1].endswith("allocator +0 mallocs, +0 frees, +0 retries")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tokenrouter.runtime.engine.eager_warm"):
        engine.warm_eager()
    assert not caplog.records


@pytest.mark.parametrize("heads", [(4, 2, 16), (16, 8, 128), (32, 8, 128)])
def test_every_attention_variant_an_eager_step_can_make_is_warmed(monkeypatch, heads):
    """On a GPU of 132 SMs (an H100), with the Triton backend's launch rules: every eager step the engine can
    run (every batch size, every longest row) launches an attention variant that some warm-up step launches
    too, so no served step builds one. Heads: the tiny model's, the 0.6B's, the 8B's. The shapes before
    missed, among others, the 0.6B's step of 5 rows and 70 new tokens (2 KV splits), which on an H100 built
    its kernel in a served step."""
    import dataclasses

    pytest.importorskip("triton")
    from tokenrouter.runtime.engine.attention.triton_backend import TritonAttnBackend
    from tokenrouter.runtime.engine.kernels import attention_shapes as ks

    monkeypatch.setattr(ks, "num_sms", lambda device: 132)
    engine = load_engine(TINY_SMALL, max_batch=80, max_len=600)
    engine.graph_runner = buckets()
    q_heads, kv_heads, head_dim = heads
    config = dataclasses.replace(
        engine.attn_backend.config, num_heads=q_heads, num_kv_heads=kv_heads, head_dim=head_dim
    )
    backend = engine.attn_backend = TritonAttnBackend(config)
    shapes = engine.eager_warm_shapes()
    warmed = {backend.launch_variant(len(s), max(s)) for s in shapes}
    steps = [(b, n) for b in range(1, 81) for n in range(1, 600) if n + b - 1 <= WARM_MAX_TOKENS]
    eager = [(b, n) for b, n in steps if engine.graph_runner.bucket(b, n) is None]
    missed = sorted(
        {
            backend.launch_variant(b, n): (b, n)
            for b, n in eager
            if backend.launch_variant(b, n) not in warmed
        }.values()
    )
    assert not missed, (
        f"eager steps (rows, longest) whose attention variant no warm-up step launches: {missed}"
    )
    assert len(shapes) < 120  # one step per variant, not one per (rows, longest row)
    if heads == (16, 8, 128):
        assert ("NUM_SPLITS", 2) in backend.launch_variant(5, 66)  # the H100 stall's step: its KV in 2 splits
