"""Routing is exact: the in-process executor (batched schedulers, pending requests, extends on return, the
real engine's paged KV) writes the same tokens, by the same models, with the same hand-offs, as the plain
sequential reference (one request at a time, no batching, no KV cache)."""

from __future__ import annotations

import pytest
from subserver_helpers import STDLIB_DEFINES, all_free, compile_policy, compile_stdlib

from tokenrouter.runtime.messages import SamplingSpec
from tokenrouter.runtime.offline import OfflineExecutor, load_offline
from tokenrouter.runtime.reference import ReferenceModel, reference_generate

PROMPTS = [[(7 * i + j * 5) % 500 + 3 for j in range(2 + i % 6)] for i in range(16)]
GREEDY = [SamplingSpec(seed=i, max_tokens=12) for i in range(16)]
ONE_AT_A_TIME = 5  # prompts also run at concurrency 1 (the reference is the same)


def check_exact(ex: OfflineExecutor, specs, results) -> None:
    refs = {name: ReferenceModel.from_engine(s.engine) for name, s in ex.schedulers.items()}
    kernels = {name: s.kernel for name, s in ex.schedulers.items()}
    for prompt, spec, res in zip(PROMPTS, specs, results, strict=False):
        ref = reference_generate(ex.plan, refs, kernels, prompt, spec)
        assert (res.token_ids, res.models, res.hops) == (ref.token_ids, ref.models, ref.hops)
        assert res.finish_reason == ref.finish_reason
    assert sum(len(r.hops) for r in results) > 0  # the policy really routes on these prompts
    assert all_free(s.engine for s in ex.schedulers.values())  # every request's KV was freed


def check_both_concurrencies(ex: OfflineExecutor, specs) -> None:
    """Concurrency 16 (all at once) must equal the reference; concurrency 1 must equal concurrency 16."""
    together = ex.generate(PROMPTS, specs)
    assert max(ex.steps.values()) < sum(len(r.token_ids) for r in together) // 2  # steps were shared
    check_exact(ex, specs, together)
    for i in range(ONE_AT_A_TIME):
        alone = ex.generate([PROMPTS[i]], specs[i])[0]
        assert (alone.token_ids, alone.models, alone.hops) == (together[i].token_ids, together[i].models,
                                                               together[i].hops)  # fmt: skip
    assert all_free(s.engine for s in ex.schedulers.values())


@pytest.mark.parametrize("policy", sorted(STDLIB_DEFINES))
def test_stdlib_policy_matches_reference(tmp_path, policy):
    check_both_concurrencies(load_offline(compile_stdlib(tmp_path, policy), "cpu"), GREEDY)


@pytest.mark.parametrize("policy", ["drop", "for_k", "keep", "three"])
def test_hand_off_forms_match_reference(tmp_path, policy):
    """keep, drop, `for K` with and without drop, three models; thresholds B > 1 so steps batch."""
    check_both_concurrencies(
        load_offline(compile_policy(tmp_path, policy, batch={"a": 3, "b": 2}), "cpu"), GREEDY
    )


def test_sampling_matches_reference(tmp_path):
    """With temperature, top-k and top-p the draws depend only on (seed, position): still exact."""
    ex = load_offline(compile_policy(tmp_path, "for_k", batch={"a": 3, "b": 2}), "cpu")
    specs = [
        SamplingSpec(
            temperature=0.9, top_k=(0, 20)[i % 2], top_p=(1.0, 0.8)[i % 3 == 0], seed=1000 + i, max_tokens=10
        )  # fmt: skip
        for i in range(len(PROMPTS))
    ]
    check_exact(ex, specs, ex.generate(PROMPTS, specs))


def test_stop_tokens_and_max_tokens(tmp_path):
    ex = load_offline(compile_policy(tmp_path, "keep"), "cpu")
    free = ex.generate([PROMPTS[3]], SamplingSpec(seed=3, max_tokens=8, ignore_eos=True))[0]
    assert len(free.token_ids) == 8 and free.finish_reason == "length"
    stop = free.token_ids[4]
    spec = SamplingSpec(seed=3, max_tokens=8, ignore_eos=True, stop_token_ids=(stop,))
    res = ex.generate([PROMPTS[3]], spec)[0]
    first = free.token_ids.index(stop)
    assert res.token_ids == free.token_ids[: first + 1] and res.finish_reason == "stop"
    assert res.models == free.models[: first + 1]
