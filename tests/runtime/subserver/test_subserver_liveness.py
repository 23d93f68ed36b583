"""Delayed batching never stalls, and aborts leave no request behind in any engine."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from subserver_helpers import all_free, compile_policy

from tokenrouter.runtime.messages import SamplingSpec
from tokenrouter.runtime.offline import OfflineExecutor, StallError, load_offline
from tokenrouter.runtime.subserver.batching import BatchingConfig

_cache: dict = {}


def runtime(tmp_path_factory, policy: str):
    if policy not in _cache:
        ex = load_offline(compile_policy(tmp_path_factory.mktemp(policy), policy), "cpu")
        engines = {name: s.engine for name, s in ex.schedulers.items()}
        kernels = {name: s.kernel for name, s in ex.schedulers.items()}
        _cache[policy] = (ex.plan, engines, kernels)
    return _cache[policy]


@st.composite
def feasible(draw):
    """A policy, N, and thresholds B with Σ(B_i − 1) < N."""
    policy = draw(st.sampled_from(["keep", "three"]))
    models = ["a", "b"] if policy == "keep" else ["a", "b", "c"]
    n = draw(st.integers(1, 10))
    slack = n - 1
    b = {}
    for name in models:
        extra = draw(st.integers(0, slack))
        b[name] = 1 + extra
        slack -= extra
    return policy, n, b


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(feasible(), st.integers(0, 2**32))
def test_delayed_batching_never_stalls_without_timeout(tmp_path_factory, case, seed):
    policy, n, b = case
    plan, engines, kernels = runtime(tmp_path_factory, policy)
    ex = OfflineExecutor(plan, engines, kernels, batching=BatchingConfig(b, max_delay_ms=None))
    prompts = [[(seed + 31 * i + j) % 500 + 3 for j in range(2 + i % 3)] for i in range(n)]
    specs = [SamplingSpec(seed=seed + i, max_tokens=4 + i % 4, ignore_eos=i % 2 == 0) for i in range(n)]
    results = ex.generate(prompts, specs)  # raises StallError if every subserver waits forever
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert all(len(r.token_ids) >= 1 for r in results)
    assert ex.clock.now == 0.0  # no timeout fired: the thresholds alone made progress
    assert all_free(engines.values())


def test_a_stale_count_stalls_without_timeout_and_the_timeout_rescues_it(tmp_path_factory):
    """Negative control: if n is never lowered after requests finish, fixed thresholds can stall (the
    executor detects it); with max_delay_ms the same run completes."""
    plan, engines, kernels = runtime(tmp_path_factory, "keep")
    prompts = [[5 + i, 9] for i in range(4)]
    specs = [SamplingSpec(seed=i, max_tokens=2 + 3 * i, ignore_eos=True) for i in range(4)]
    b = {"a": 3, "b": 2}  # Σ(B − 1) = 3 < N = 4, fine while n = 4 is true
    ex = OfflineExecutor(plan, engines, kernels, batching=BatchingConfig(b, None), publish_active=False)
    with pytest.raises(StallError, match="stalled"):
        ex.generate(prompts, specs)
    for e in engines.values():
        for rid in ex.results:
            e.release(rid)
    ex = OfflineExecutor(plan, engines, kernels, batching=BatchingConfig(b, 5.0), publish_active=False)
    results = ex.generate(prompts, specs)
    assert [len(r.token_ids) for r in results] == [2, 5, 8, 11]
    assert ex.clock.now > 0.0  # the timeout did fire


def test_aborts_free_every_engine(tmp_path_factory):
    plan, engines, kernels = runtime(tmp_path_factory, "three")
    ex = OfflineExecutor(plan, engines, kernels, batching=BatchingConfig({"a": 2, "b": 2, "c": 1}, 5.0))
    specs = [SamplingSpec(seed=i, max_tokens=30, ignore_eos=True) for i in range(12)]
    for i, s in enumerate(specs):
        ex.submit(f"r{i}", [3 + i, 4, 5], s)
    for _ in range(6):  # some requests are now pending on one model and running on another
        ex.round()
    pending = sum(s.counts()["pending"] for s in ex.schedulers.values())
    assert pending > 0
    for i in range(0, 12, 2):
        ex.abort(f"r{i}")
    results = ex.run()
    assert all(results[f"r{i}"].finish_reason == "abort" for i in range(0, 12, 2))
    assert all(len(results[f"r{i}"].token_ids) == 30 for i in range(1, 12, 2))
    for name, s in ex.schedulers.items():
        assert s.reqs == {} and not s.runnable, name
    assert all_free(engines.values())


def test_soak_rolling_concurrency_32_with_aborts(tmp_path_factory):
    """300 requests, 32 active at any time (a new one arrives as one ends), ~10% aborted mid-way, timeout
    disabled: every request ends, every pool is freed, and sampled survivors equal the reference."""
    import random

    from tokenrouter.runtime.reference import ReferenceModel, reference_generate

    plan, engines, kernels = runtime(tmp_path_factory, "three")
    ex = OfflineExecutor(plan, engines, kernels, batching=BatchingConfig({"a": 4, "b": 3, "c": 2}, None))
    rng = random.Random(0)
    total, submitted, aborted = 300, 0, set()
    specs = {}
    while submitted < total or ex.active:
        while submitted < total and len(ex.active) < 32:
            rid = f"s{submitted}"
            specs[rid] = ([rng.randrange(3, 500) for _ in range(rng.randint(1, 12))],
                          SamplingSpec(seed=submitted, max_tokens=rng.randint(1, 40)))  # fmt: skip
            ex.submit(rid, *specs[rid])
            submitted += 1
        ex.round()
        for rid in sorted(ex.active):  # every 10th request is aborted once it has written 2 tokens
            if int(rid[1:]) % 10 == 3 and len(ex.results[rid].token_ids) >= 2:
                aborted.add(rid)
                ex.abort(rid)
    assert len(ex.results) == total and not ex.active
    assert all(
        r.finish_reason in ("stop", "length", "abort") and r.error is None for r in ex.results.values()
    )
    assert len(aborted) >= 15  # most of the 30 (a short one may finish first)
    assert all_free(engines.values())
    for s in ex.schedulers.values():
        assert s.reqs == {} and not s.runnable
    refs = {name: ReferenceModel.from_engine(e) for name, e in engines.items()}
    survivors = [rid for rid in ex.results if rid not in aborted]
    for rid in rng.sample(survivors, 12):
        ref = reference_generate(plan, refs, kernels, *specs[rid])
        assert (ex.results[rid].token_ids, ex.results[rid].models) == (ref.token_ids, ref.models)
