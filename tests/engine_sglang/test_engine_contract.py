"""The Engine seam's contract (`tokenrouter/runtime/engine/base.py`), one suite for every implementation.

Parameterized over engines: the embedded engine on CPU (always), and on a CUDA machine the embedded engine in
bf16 and `SGLangEngine` (marked `gpu`; skipped without CUDA, and the SGLang one without SGLang). On CPU,
`SGLangEngine` itself also runs over a stand-in for SGLang's runner and pools (`fake_sglang.py`), which checks
its slot / row / position bookkeeping against the same contract. Every check
compares an engine with itself: the last-position logits of a sequence must not depend on how its tokens were
split into prefill / extend / decode steps, on which other rows shared a step, on holds between steps, or on
evictions. Tolerances: float32 1e-4 relative, bf16 3e-2 relative (batch-shape-dependent kernels); a wrong
KV cache (a missing or misplaced prefix) gives errors of order 1.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from tokenrouter.runtime.engine.base import EngineError, StepInput
from tokenrouter.runtime.engine.embedded import load_engine

REPO = Path(__file__).resolve().parents[2]
TINY_SMALL = REPO / "examples" / "models" / "tiny-small"
POOL = 256  # KV slots of the CPU engine: small, so that eviction is cheap to provoke
POOL_GPU = 4096  # on the GPU (SGLang sizes some buffers from its pool: not too small)
GPU_SHAPE = dict(
    hidden=256, intermediate=512, layers=2, heads=16, kv_heads=8, head_dim=128
)  # 0.6B's attention

ENGINES = [
    pytest.param("embedded-cpu", id="embedded-cpu"),
    pytest.param("sglang-fake", id="sglang-fake"),  # SGLangEngine's bookkeeping over a CPU stand-in runner
    pytest.param("embedded-cuda", id="embedded-cuda", marks=pytest.mark.gpu),
    pytest.param("sglang", id="sglang", marks=pytest.mark.gpu),
]


def _gpu_model(root: Path) -> Path:
    from tokenrouter.runtime.engine.make_model import make_model, shape_for

    out = root / "contract-gpu"
    if not (out / "config.json").exists():
        make_model(out, shape_for("tiny", **GPU_SHAPE), seed=3, weights=True)
    return out


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tmp_path_factory):
    kind = request.param
    if kind == "embedded-cpu":
        return load_engine(TINY_SMALL, max_tokens=POOL, max_batch=8)
    if kind == "sglang-fake":
        from fake_sglang import fake_sglang_engine

        return fake_sglang_engine(load_engine(TINY_SMALL), pool=POOL)
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    folder = _gpu_model(tmp_path_factory.getbasetemp())
    if kind == "embedded-cuda":
        return load_engine(folder, device="cuda", dtype="bfloat16", max_tokens=POOL_GPU, max_batch=8)
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed (docs/sglang.md)")
    from tokenrouter.runtime.engine.sglang_engine import load_sglang_engine

    return load_sglang_engine(folder, device="cuda:0", max_tokens=POOL_GPU, max_batch=8)


def tol(engine) -> float:
    return 1e-4 if engine.info.dtype == torch.float32 else 3e-2


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def seq(n: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def whole(engine, rid: str, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Last-position logits and hidden state of `tokens` as one prefill of a fresh request."""
    out = engine.forward([StepInput(rid, tokens)], want_hidden=True)
    engine.release(rid)
    return out.logits[0], out.hidden[0]


def assert_idle(engine, baseline: dict) -> None:
    s = engine.stats()
    for key in ("pages_free", "req_slots_free", "requests", "held"):
        assert s[key] == baseline[key], key


def test_info_matches_step_outputs(engine):
    base = engine.stats()
    vocab = engine.info.vocab_size
    out = engine.forward([StepInput("info-a", seq(5, 1, vocab)), StepInput("info-b", [7])], want_hidden=True)
    assert out.logits.shape == (2, vocab)
    assert out.hidden.shape == (2, engine.info.hidden_size)
    assert out.logits.device.type == engine.info.device.type
    assert out.logits.dtype == engine.info.logits_dtype and torch.isfinite(out.logits.float()).all()
    assert engine.forward([StepInput("info-b", [8])]).hidden is None  # only when asked
    assert engine.info.max_len >= 64 and engine.info.eos_token_ids
    for rid in ("info-a", "info-b"):
        engine.release(rid)
    assert_idle(engine, base)


def test_mixed_steps_equal_one_prefill(engine):
    """Prefill, extend and decode rows mixed in ragged steps, with holds, give the logits and hidden states
    of one prefill of the same tokens."""
    base = engine.stats()
    vocab = engine.info.vocab_size
    seqs = {"a": seq(20, 11, vocab), "b": seq(16, 12, vocab), "c": seq(16, 13, vocab)}
    plan = [  # per step: {rid: tokens this step}; a rid absent from a step is held
        ({"a": 5, "b": 4}, "extend"),
        ({"a": 1, "c": 7}, "mixed"),  # b held
        ({"a": 3, "b": 1, "c": 1}, "mixed"),
        ({"a": 1, "b": 1, "c": 1}, "decode"),
        ({"a": 1, "b": 1}, "decode"),  # c held
        ({"a": 4, "c": 3}, "extend"),  # b held; c resumes with an extend
        ({"a": 1, "b": 3, "c": 1}, "mixed"),  # b resumes after two steps away
    ]
    done = dict.fromkeys(seqs, 0)
    checks = []
    graph_steps = base.get("graph_steps")
    for rows, mode in plan:
        batch = [StepInput(rid, seqs[rid][done[rid] : done[rid] + n]) for rid, n in rows.items()]
        out = engine.forward(batch, want_hidden=True)
        assert out.stats["mode"] == mode
        assert out.stats["tokens"] == sum(rows.values())
        for i, (rid, n) in enumerate(rows.items()):
            done[rid] += n
            checks.append((rid, done[rid], out.logits[i].clone(), out.hidden[i].clone()))
            assert engine.seq_len(rid) == done[rid]
    if graph_steps is not None and base.get("cuda_graph"):  # engines that count graph replays (SGLang)
        assert engine.stats()["graph_steps"] >= graph_steps + 2  # the two all-decode steps replayed graphs
    for rid in seqs:
        engine.release(rid)
    assert_idle(engine, base)
    for rid, n, logits, hidden in checks:
        ref_logits, ref_hidden = whole(engine, f"ref-{rid}-{n}", seqs[rid][:n])
        assert rel_err(logits, ref_logits) < tol(engine), (rid, n)
        assert rel_err(hidden, ref_hidden) < tol(engine), (rid, n)
    assert_idle(engine, base)


def test_hold_then_resume_equals_uninterrupted(engine):
    """Greedy decoding with one request held while others run, then resumed by an extend of the tokens it
    missed, ends where uninterrupted decoding ends."""
    base = engine.stats()
    vocab = engine.info.vocab_size
    prompt = seq(9, 21, vocab)
    out = engine.forward([StepInput("u", prompt)])
    tokens = []
    for _ in range(6):
        tokens.append(int(out.logits[0].argmax()))
        out = engine.forward([StepInput("u", [tokens[-1]])])
    uninterrupted = out.logits[0].clone()

    engine.forward([StepInput("h", prompt)])
    for k in range(3):  # other requests run while "h" is held
        engine.forward([StepInput(f"other{k}", seq(4 + k, 30 + k, vocab))])
    resumed = engine.forward([StepInput("h", tokens), StepInput("other0", [5])]).logits[0]
    assert engine.seq_len("h") == engine.seq_len("u") == len(prompt) + len(tokens)
    assert rel_err(resumed, uninterrupted) < tol(engine)
    for rid in ("u", "h", "other0", "other1", "other2"):
        engine.release(rid)
    assert_idle(engine, base)


def test_release_frees_and_forgets(engine):
    base = engine.stats()
    vocab = engine.info.vocab_size
    first = engine.forward([StepInput("r", seq(30, 41, vocab)), StepInput("s", seq(3, 42, vocab))]).logits[0]
    engine.forward([StepInput("r", [9, 10])])
    busy = engine.stats()
    assert busy["pages_free"] == base["pages_free"] - 35
    assert busy["requests"] == base["requests"] + 2
    engine.release("r")
    engine.release("r")  # idempotent
    engine.release("never-seen")  # no-op
    assert engine.seq_len("r") == 0 and engine.seq_len("s") == 3
    assert engine.stats()["pages_free"] == base["pages_free"] - 3
    engine.release("s")
    assert_idle(engine, base)
    again = engine.forward([StepInput("r", seq(30, 41, vocab))]).logits[0]  # a new request: no stale KV
    assert rel_err(again, first) < tol(engine)
    engine.release("r")
    assert_idle(engine, base)


def test_eviction_is_invisible(engine):
    """Held requests that do not fit are evicted (LRU) and transparently re-prefilled."""
    base = engine.stats()
    vocab = engine.info.vocab_size
    n = base["pages_total"] // 3
    a = seq(n, 51, vocab)
    engine.forward([StepInput("ev-a", a)])
    before = engine.stats()["evictions"]
    for k in range(3):  # 3 more requests of n tokens: "ev-a" cannot stay resident
        engine.forward([StepInput(f"ev-{k}", seq(n, 52 + k, vocab))])
    assert engine.stats()["evictions"] > before
    resumed = engine.forward([StepInput("ev-a", [11, 12])])
    assert resumed.stats["reprefilled"] == 1
    assert engine.seq_len("ev-a") == n + 2
    for rid in ("ev-a", "ev-0", "ev-1", "ev-2"):
        engine.release(rid)
    assert_idle(engine, base)
    ref, _ = whole(engine, "ev-ref", a + [11, 12])
    assert rel_err(resumed.logits[0], ref) < tol(engine)


def test_refused_rows_change_nothing(engine):
    base = engine.stats()
    vocab = engine.info.vocab_size
    engine.forward([StepInput("ok", [1, 2, 3])])
    before = engine.stats()
    too_long = list(range(3, 3 + engine.info.max_len + 1))
    too_long = [t % vocab for t in too_long]
    for bad, word in [
        ([StepInput("ok", [4]), StepInput("long", too_long)], "max_len"),
        ([StepInput("ok", [4]), StepInput("empty", [])], "at least one"),
        ([StepInput("ok", [4]), StepInput("oov", [vocab])], "out of range"),
        ([StepInput("ok", [4]), StepInput("ok", [5])], "twice"),
    ]:
        with pytest.raises(EngineError, match=word) as info:
            engine.forward(bad)
        assert getattr(info.value, "rid", None) == bad[1].rid  # the scheduler fails that row by rid
        assert engine.stats() == before
        assert engine.seq_len("ok") == 3
    with pytest.raises(ValueError):
        engine.forward([])
    assert engine.forward([StepInput("ok", [4])]).logits.shape == (1, vocab)
    engine.release("ok")
    assert_idle(engine, base)


def test_embed_rows(engine):
    ids = torch.tensor([0, 5, 7, 5])
    rows = engine.embed(ids)
    assert rows.shape == (4, engine.info.hidden_size)
    assert rows.device.type == engine.info.device.type
    torch.testing.assert_close(rows[1], rows[3])
    assert not torch.equal(rows[1], rows[2])


def test_stats_keys(engine):
    s = engine.stats()
    assert {"pages_total", "pages_free", "held", "evictions", "requests", "reprefills", "steps"} <= s.keys()
    assert 0 <= s["pages_free"] <= s["pages_total"]
    out = engine.forward([StepInput("st", [1, 2])])
    assert {"mode", "rows", "tokens", "evicted", "reprefilled"} <= out.stats.keys()
    assert engine.stats()["steps"] == s["steps"] + 1
    engine.release("st")


def test_sglang_logits_are_float32_on_a_bfloat16_model():
    """SGLang's logits processor returns float32 logits whatever the model's dtype, and the engine says so
    (`info.logits_dtype`): the route kernel is warmed for the dtype its steps will pass (`RouteKernel.warm`)."""
    from fake_sglang import fake_sglang_engine

    engine = fake_sglang_engine(load_engine(TINY_SMALL, dtype="bfloat16"), pool=POOL)
    assert engine.info.dtype == torch.bfloat16 and engine.info.logits_dtype == torch.float32
    out = engine.forward([StepInput("f32", [5, 6, 7])], want_hidden=True)
    assert out.logits.dtype == torch.float32 and out.hidden.dtype == torch.bfloat16
    embedded = load_engine(TINY_SMALL, dtype="bfloat16")
    assert embedded.info.logits_dtype == torch.bfloat16


def test_the_route_kernel_is_warmed_for_the_engines_logits_dtype(monkeypatch):
    """`load_model_runtime` warms the route kernel for the logits the engine's steps pass (float32 from SGLang
    on a bfloat16 model: warmed for bfloat16, every float32 launch variant would still be built in a step),
    for `warm_rows` rows (the scheduler's max_batch), else the engine's max_batch."""
    from fake_sglang import fake_sglang_engine

    from tokenrouter.compiler.driver import load_plan
    from tokenrouter.runtime.route import RouteKernel
    from tokenrouter.runtime.subserver import loading

    engine = fake_sglang_engine(load_engine(TINY_SMALL, dtype="bfloat16"), pool=POOL, max_batch=6)
    monkeypatch.setattr(loading, "load_model_engine", lambda *a, **k: engine)
    warmed = []
    monkeypatch.setattr(RouteKernel, "warm", lambda self, *a, **kw: warmed.append(a) or 0)
    plan = load_plan(str(REPO / "examples" / "bernoulli.tr"))
    for rows, want in ((None, 6), (3, 3)):
        got, _ = loading.load_model_runtime(plan, "slm", "cpu", warm_rows=rows)
        assert got is engine
        info = engine.info
        assert warmed.pop() == (want, info.vocab_size, torch.float32, info.hidden_size)
