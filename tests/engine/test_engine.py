"""EmbeddedEngine behaviour: batching, hold/resume/evict, pool accounting, errors."""

import random
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrouter.runtime.engine.base import EngineError, StepInput
from tokenrouter.runtime.engine.embedded import load_engine
from tokenrouter.runtime.engine.generate import generate
from tokenrouter.runtime.engine.held import EngineRowError
from tokenrouter.runtime.sampling import SamplingParams

REPO = Path(__file__).resolve().parents[2]
TINY_SMALL = REPO / "examples" / "models" / "tiny-small"
TINY_LARGE = REPO / "examples" / "models" / "tiny-large"

PROMPTS = [[5, 17, 300, 42, 9], [1], [100, 200, 300, 400, 500, 7, 8, 9, 10, 11, 12], [77, 78], [450, 3, 3, 3]]


def assert_all_free(engine):
    s = engine.stats()
    assert s["pages_free"] == s["pages_total"]
    assert s["req_slots_free"] == s["req_slots_total"]
    assert s["requests"] == 0


@pytest.mark.parametrize("folder", [TINY_SMALL, TINY_LARGE])
def test_batched_generation_equals_each_alone(folder):
    engine = load_engine(folder)
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * 3 + [
        SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=1.2, top_k=20, seed=6, max_tokens=12, ignore_eos=True),
    ]
    batched = generate(engine, PROMPTS, params)
    assert_all_free(engine)
    alone = [generate(engine, [p], [sp])[0] for p, sp in zip(PROMPTS, params, strict=True)]
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    assert all(len(r.token_ids) == 12 and r.finish_reason == "length" for r in batched)
    # not all identical: the model does depend on its input
    assert len({tuple(r.token_ids) for r in batched}) > 1


def run_schedule(engine, prompts, steps, seed):
    """Greedy decoding where each step runs a random subset of the requests (the rest are held)."""
    rng = random.Random(seed)
    feed = {i: list(p) for i, p in enumerate(prompts)}
    out_tokens = {i: [] for i in feed}
    for _ in range(steps):
        chosen = [i for i in feed if rng.random() < 0.5] or [rng.choice(list(feed))]
        out = engine.forward([StepInput(f"r{i}", feed[i]) for i in chosen])
        for i, tok in zip(chosen, out.logits.argmax(-1).tolist(), strict=True):
            out_tokens[i].append(tok)
            # sometimes a "peer" wrote a few tokens while the request was away: resume with an extend
            feed[i] = [tok] + (
                [rng.randrange(512) for _ in range(rng.randrange(1, 4))] if rng.random() < 0.3 else []
            )
    return out_tokens


def test_hold_resume_and_eviction_never_change_tokens():
    big = load_engine(TINY_SMALL)
    small = load_engine(TINY_SMALL, max_tokens=48, max_reqs=3)
    want = run_schedule(big, PROMPTS, 14, seed=1)
    got = run_schedule(small, PROMPTS, 14, seed=1)
    assert got == want
    s = small.stats()
    assert s["evictions"] > 0 and s["reprefills"] > 0
    assert big.stats()["evictions"] == 0
    for i in range(len(PROMPTS)):
        assert small.seq_len(f"r{i}") == big.seq_len(f"r{i}") > 0
        small.release(f"r{i}")
        big.release(f"r{i}")
    assert_all_free(small)
    assert_all_free(big)


def test_batch_larger_than_pool_runs_in_pieces_with_same_logits():
    ref = load_engine(TINY_SMALL)
    tight = load_engine(TINY_SMALL, max_tokens=16, max_batch=2)
    rows = [StepInput(f"r{i}", p) for i, p in enumerate(PROMPTS)]
    a = ref.forward(rows, want_hidden=True)
    b = tight.forward(rows, want_hidden=True)
    assert b.stats["forwards"] > 1
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.hidden, b.hidden, rtol=1e-5, atol=1e-5)


def test_refused_row_changes_nothing():
    engine = load_engine(TINY_SMALL, max_tokens=32)
    engine.forward([StepInput("a", [1, 2, 3])])
    before = engine.stats()
    for bad, word in [
        ([StepInput("a", [4]), StepInput("b", list(range(40)))], "max_len"),
        ([StepInput("a", [4]), StepInput("c", [])], "at least one"),
        ([StepInput("a", [4]), StepInput("c", [512])], "out of range"),
        ([StepInput("a", [4]), StepInput("a", [5])], "twice"),
    ]:
        with pytest.raises(EngineRowError, match=word) as info:
            engine.forward(bad)
        assert info.value.rid != "a" or word == "twice"
        assert engine.stats() == before
        assert engine.seq_len("a") == 3
    # the caller retries the good row
    assert engine.forward([StepInput("a", [4])]).logits.shape == (1, 512)
    assert engine.seq_len("a") == 4


def test_embed_and_info():
    engine = load_engine(TINY_SMALL)
    ids = torch.tensor([0, 5, 511])
    torch.testing.assert_close(engine.embed(ids), engine.model.model.embed_tokens.weight[ids])
    assert engine.info.vocab_size == 512 and engine.info.hidden_size == 64
    assert engine.info.eos_token_ids == (2, 0)
    assert engine.seq_len("nobody") == 0
    engine.release("nobody")  # no-op


ops = st.lists(
    st.tuples(
        st.sampled_from(["step", "release"]),
        st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True),
        st.integers(1, 6),
    ),
    min_size=1,
    max_size=25,
)


@pytest.fixture(scope="module")
def tight_engine():
    return load_engine(TINY_SMALL, max_tokens=24, max_reqs=4, max_batch=3)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(sequence=ops)
def test_pool_accounting_after_any_mix(tight_engine, sequence):
    engine = tight_engine
    assert_all_free(engine)  # the previous example cleaned up
    lengths: dict[str, int] = {}
    for op, ids, n in sequence:
        rids = [f"r{i}" for i in ids]
        if op == "release":
            for rid in rids:
                engine.release(rid)
                lengths.pop(rid, None)
            continue
        rows = [StepInput(rid, [(7 * len(rid) + k) % 512 for k in range(n)]) for rid in rids]
        try:
            engine.forward(rows)
        except EngineRowError:
            assert any(lengths.get(r.rid, 0) + n > engine.max_len for r in rows)
            continue
        for rid in rids:
            lengths[rid] = lengths.get(rid, 0) + n
        s = engine.stats()
        resident = [r for r in engine.reqs.values() if r.req_pool_idx]
        assert s["pages_used"] == sum(r.kv_len for r in resident)
        assert s["req_slots_total"] - s["req_slots_free"] == len(resident)
        assert all(engine.seq_len(rid) == length for rid, length in lengths.items())
    for rid in list(lengths):
        engine.release(rid)
    assert_all_free(engine)


def test_bf16_runs_close_to_fp32():
    ids = PROMPTS[2]
    ref = load_engine(TINY_SMALL).forward([StepInput("a", ids)]).logits
    out = load_engine(TINY_SMALL, dtype="bfloat16").forward([StepInput("a", ids)])
    assert out.logits.dtype == torch.bfloat16
    assert torch.allclose(out.logits.float(), ref, atol=0.3)


def test_dummy_load_needs_no_weights_and_is_seeded(tmp_path):
    from tokenrouter.runtime.engine.make_model import make_model, shape_for

    folder = make_model(tmp_path / "big-ish", shape_for("tiny", hidden=96, layers=3), weights=False)
    assert not list(folder.glob("*.safetensors"))
    with pytest.raises(EngineError, match="safetensors"):
        load_engine(folder)
    a = load_engine(folder, load="dummy", seed=3).forward([StepInput("x", [1, 2])]).logits
    b = load_engine(folder, load="dummy", seed=3).forward([StepInput("x", [1, 2])]).logits
    c = load_engine(folder, load="dummy", seed=4).forward([StepInput("x", [1, 2])]).logits
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(dtype="int8"), "dtype"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=10, mem_bytes=10), "not both"),
        (dict(load="lazy"), "load"),
        (dict(max_batch=0), "max_batch"),
    ],
)
def test_bad_settings(kwargs, word):
    with pytest.raises(ValueError, match=word):
        load_engine(TINY_SMALL, **kwargs)


def test_tiny_budget_is_a_clear_error():
    with pytest.raises(EngineError, match="holds no token"):
        load_engine(TINY_SMALL, mem_bytes=100)
    with pytest.raises(EngineError, match="unknown attention backend"):
        load_engine(TINY_SMALL, attention="flash")


def test_numpy_token_ids_are_accepted_and_floats_refused():
    import numpy as np

    engine = load_engine(TINY_SMALL)
    a = engine.forward([StepInput("a", [np.int64(5), np.int32(6)])]).logits
    b = engine.forward([StepInput("b", [5, 6])]).logits
    torch.testing.assert_close(a, b)
    with pytest.raises(EngineRowError, match="ints"):
        engine.forward([StepInput("c", [1.0])])


def test_an_engine_on_another_gpu_is_made_current(monkeypatch):
    """Triton launches on the current device's stream and graphs capture the current stream, so an engine
    placed on cuda:1 makes cuda:1 current (load_engine), and the in-process executor steps each engine with
    its device current (device_scope); CPU and index-less devices are left alone."""
    import contextlib

    from tokenrouter.runtime.engine import embedded

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: calls.append(("set", str(dev))))
    monkeypatch.setattr(
        torch.cuda, "device", lambda dev: calls.append(("scope", str(dev))) or contextlib.nullcontext()
    )
    embedded.make_current(torch.device("cuda:1"))
    embedded.make_current(torch.device("cpu"))
    embedded.make_current(torch.device("cuda"))
    with embedded.device_scope("cuda:1"):
        pass
    for other in ("cpu", None, torch.device("cpu")):
        assert isinstance(embedded.device_scope(other), contextlib.nullcontext)
    assert calls == [("set", "cuda:1"), ("scope", "cuda:1")]
