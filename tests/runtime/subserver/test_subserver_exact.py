"""Routing is exact: the in-process executor (batched schedulers, pending requests, extends on return)
writes the same tokens, by the same models, with the same hand-offs, as the plain sequential reference."""

from __future__ import annotations

import pytest
from subserver_helpers import POLICIES, RecomputeEngine, compile_policy, tiny_model

from tokenrouter.runtime.messages import SamplingSpec
from tokenrouter.runtime.offline import OfflineExecutor
from tokenrouter.runtime.reference import ReferenceModel, reference_generate
from tokenrouter.runtime.route import RouteKernel

PROMPTS = [[(7 * i + j * 5) % 90 + 2 for j in range(2 + i % 6)] for i in range(16)]


def build(plan: dict):
    engines = {name: RecomputeEngine(tiny_model(seed), name) for seed, name in enumerate(plan["models"])}
    kernels = {name: RouteKernel(plan, name, "torch", "cpu") for name in plan["models"]}
    return engines, kernels


def check_exact(plan, engines, kernels, specs, results):
    refs = {name: ReferenceModel.from_engine(e) for name, e in engines.items()}
    hops = 0
    for prompt, spec, res in zip(PROMPTS, specs, results, strict=False):
        ref = reference_generate(plan, refs, kernels, prompt, spec)
        assert (res.token_ids, res.models, res.hops) == (ref.token_ids, ref.models, ref.hops)
        assert res.finish_reason == ref.finish_reason
        hops += len(res.hops)
    assert hops > 0  # the policies really route
    assert all(e.stats()["held"] == 0 for e in engines.values())  # every request's KV was freed


@pytest.mark.parametrize("concurrency", [1, 16])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_greedy_matches_reference(tmp_path, policy, concurrency):
    plan = compile_policy(tmp_path, policy, batch={"a": 2, "b": 3})
    engines, kernels = build(plan)
    ex = OfflineExecutor(plan, engines, kernels)
    specs = [SamplingSpec(seed=i, max_tokens=12) for i in range(len(PROMPTS))]
    if concurrency == 1:
        results = [ex.generate([p], s)[0] for p, s in zip(PROMPTS, specs, strict=True)]
    else:
        results = ex.generate(PROMPTS, specs)
        assert max(ex.steps.values()) < 12 * len(PROMPTS) // 2  # requests really shared steps
    check_exact(plan, engines, kernels, specs, results)


def test_sampling_matches_reference(tmp_path):
    """With temperature, top-k and top-p the draws depend only on (seed, position): still exact."""
    plan = compile_policy(tmp_path, "for_k", batch={"a": 3, "b": 2})
    engines, kernels = build(plan)
    specs = [
        SamplingSpec(
            temperature=0.9, top_k=(0, 20)[i % 2], top_p=(1.0, 0.8)[i % 3 == 0], seed=1000 + i, max_tokens=10
        )
        for i in range(len(PROMPTS))
    ]
    results = OfflineExecutor(plan, engines, kernels).generate(PROMPTS, specs)
    check_exact(plan, engines, kernels, specs, results)


def test_stop_tokens_and_max_tokens(tmp_path):
    plan = compile_policy(tmp_path, "keep")
    engines, kernels = build(plan)
    ex = OfflineExecutor(plan, engines, kernels)
    free = ex.generate([PROMPTS[3]], SamplingSpec(seed=3, max_tokens=8, ignore_eos=True))[0]
    assert len(free.token_ids) == 8 and free.finish_reason == "length"
    stop = free.token_ids[4]
    res = ex.generate(
        [PROMPTS[3]], SamplingSpec(seed=3, max_tokens=8, ignore_eos=True, stop_token_ids=(stop,))
    )[0]
    first = free.token_ids.index(stop)
    assert res.token_ids == free.token_ids[: first + 1] and res.finish_reason == "stop"
    assert res.models == free.models[: first + 1]
