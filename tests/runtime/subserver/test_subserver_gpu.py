"""On CUDA (skipped without): the executor with the Triton route kernel and the paged engine in float32
matches the sequential reference; in bfloat16 (the default on CUDA) every request completes and every
pool is freed."""

from __future__ import annotations

import pytest
import torch
from subserver_helpers import all_free, compile_stdlib

from tokenrouter.runtime.messages import SamplingSpec
from tokenrouter.runtime.offline import load_offline
from tokenrouter.runtime.reference import ReferenceModel, reference_generate

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
PROMPTS = [[(11 * i + j * 3) % 500 + 3 for j in range(2 + i % 7)] for i in range(32)]
SPECS = [SamplingSpec(seed=i, max_tokens=24) for i in range(32)]


@pytest.mark.parametrize("policy", ["bernoulli", "co_llm", "multi_expert", "r_stitch"])
def test_gpu_float32_matches_reference(tmp_path, policy):
    plan = compile_stdlib(tmp_path, policy)
    for spec in plan["models"].values():
        spec["dtype"] = "float32"
    ex = load_offline(plan, "cuda:0")
    assert all(s.engine.info.device.type == "cuda" for s in ex.schedulers.values())
    results = ex.generate(PROMPTS, SPECS)
    refs = {name: ReferenceModel.from_engine(s.engine) for name, s in ex.schedulers.items()}
    kernels = {name: s.kernel for name, s in ex.schedulers.items()}
    for prompt, spec, res in zip(PROMPTS, SPECS, results, strict=True):
        ref = reference_generate(plan, refs, kernels, prompt, spec)
        assert (res.token_ids, res.models) == (ref.token_ids, ref.models)
    assert all_free(s.engine for s in ex.schedulers.values())


def test_gpu_bfloat16_completes_and_frees(tmp_path):
    ex = load_offline(compile_stdlib(tmp_path, "citer"), "cuda:0")
    results = ex.generate(PROMPTS * 4, SPECS * 4)
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert sum(len(r.hops) for r in results) > 0
    assert all_free(s.engine for s in ex.schedulers.values())
