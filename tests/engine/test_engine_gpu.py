"""The embedded engine on CUDA (skipped without a GPU): the same logits as on CPU, every attention path."""

from pathlib import Path

import pytest
import torch

from tokenrouter.runtime.engine.base import StepInput
from tokenrouter.runtime.engine.embedded import load_engine
from tokenrouter.runtime.engine.generate import generate
from tokenrouter.runtime.sampling import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TINY_LARGE = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-large"
STEPS = [
    [StepInput("a", [5, 17, 300, 42, 9, 11, 12]), StepInput("b", [1, 2])],
    [StepInput("a", [3]), StepInput("b", [4])],
    [StepInput("b", [6, 7, 8])],  # a held
    [StepInput("a", [10, 20]), StepInput("b", [9])],  # a resumes by an extend, b decodes
]


def run(engine):
    return [engine.forward(step, want_hidden=True) for step in STEPS]


@pytest.mark.parametrize("attention, graphs", [("sdpa", False), ("auto", False), ("auto", True)])
def test_cuda_fp32_matches_cpu(attention, graphs):
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = run(load_engine(TINY_LARGE, dtype="float32"))
    gpu = load_engine(TINY_LARGE, device="cuda", dtype="float32", attention=attention, cuda_graph=graphs)
    for want, got in zip(ref, run(gpu), strict=True):
        torch.testing.assert_close(got.logits.cpu(), want.logits, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(got.hidden.cpu(), want.hidden, rtol=1e-3, atol=1e-3)


def test_cuda_bf16_generation_and_pool_accounting():
    engine = load_engine(TINY_LARGE, device="cuda")
    assert engine.dtype == torch.bfloat16
    prompts = [[5, 17, 300], [1], [100, 200, 300, 400], [7, 7]]
    params = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 4
    out = generate(engine, prompts, params)
    assert all(len(r.token_ids) == 8 for r in out)
    s = engine.stats()
    assert s["pages_free"] == s["pages_total"] and s["requests"] == 0


def test_dummy_load_of_a_real_shape(tmp_path):
    from tokenrouter.runtime.engine.make_model import make_model, shape_for

    folder = make_model(tmp_path / "q", shape_for("qwen3-0.6b"))
    engine = load_engine(folder, device="cuda", load="dummy", max_tokens=4096)
    out = engine.forward([StepInput("x", list(range(100)))])
    assert out.logits.shape == (1, 151936) and torch.isfinite(out.logits.float()).all()
