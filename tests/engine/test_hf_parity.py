"""The engine's logits against HF transformers' reference forward of the same folder (fp32): at prefill,
at decode, and across hold -> resume (extend), for Qwen3, Qwen2 (biases), Llama (incl. llama3 rope) and Mistral."""

import pytest
import torch

from tokenrouter.runtime.engine.base import StepInput
from tokenrouter.runtime.engine.embedded import load_engine

transformers = pytest.importorskip("transformers")

TOL = dict(rtol=1e-4, atol=1e-4)


def hf_logits(folder, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0], out.hidden_states[-1][0]


@pytest.mark.parametrize("variant", ["qwen3", "qwen2", "llama", "llama3-rope", "mistral"])
def test_engine_matches_hf(model_dirs, variant):
    folder = model_dirs[variant]
    g = torch.Generator().manual_seed(0)
    seq_a = torch.randint(0, 512, (90,), generator=g).tolist()
    seq_b = torch.randint(0, 512, (40,), generator=g).tolist()
    ref_a, hid_a = hf_logits(folder, seq_a)
    ref_b, _ = hf_logits(folder, seq_b)
    engine = load_engine(folder, dtype="float32")

    # prefill (two requests of different lengths in one ragged step), with hidden states
    out = engine.forward([StepInput("a", seq_a[:70]), StepInput("b", seq_b[:20])], want_hidden=True)
    torch.testing.assert_close(out.logits[0], ref_a[69], **TOL)
    torch.testing.assert_close(out.logits[1], ref_b[19], **TOL)
    torch.testing.assert_close(out.hidden[0], hid_a[69], **TOL)
    # decode steps: one token each
    for i in range(3):
        out = engine.forward([StepInput("a", [seq_a[70 + i]]), StepInput("b", [seq_b[20 + i]])])
        torch.testing.assert_close(out.logits[0], ref_a[70 + i], **TOL)
        torch.testing.assert_close(out.logits[1], ref_b[20 + i], **TOL)
    # a is held while b decodes alone; then a resumes by an extend of several tokens next to b's decode
    out = engine.forward([StepInput("b", [seq_b[23]])])
    torch.testing.assert_close(out.logits[0], ref_b[23], **TOL)
    out = engine.forward([StepInput("b", [seq_b[24]]), StepInput("a", seq_a[73:90])])
    assert out.stats["mode"] == "mixed"
    torch.testing.assert_close(out.logits[0], ref_b[24], **TOL)
    torch.testing.assert_close(out.logits[1], ref_a[89], **TOL)
    # teacher-forced full pass
    logits, hidden = engine.forward_full(seq_a)
    torch.testing.assert_close(logits, ref_a, **TOL)
    torch.testing.assert_close(hidden, hid_a, **TOL)
