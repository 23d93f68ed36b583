"""The torch renderer (the reference route kernel) against a plain per-row Python evaluation of the IR."""

from __future__ import annotations

import math

import pytest
import torch
from route_cases import CASES, IR, with_router
from route_inputs import extreme_logits, mixed_state, random_logits, tie_logits
from route_reference import reference

from tokenrouter.compiler.kernels.route_ir import ARITY, FEATURES
from tokenrouter.runtime.route import RouteBatchState, RouteKernel


def plan_for(ir: dict, routers: dict | None = None) -> dict:
    return {"routes": {ir["model"]: ir}, "routers": routers or {}, "models": {}}


def assert_matches(result, ref: list[dict], ir: dict) -> None:
    assert result.token.tolist() == [r["token"] for r in ref]
    assert result.rule.tolist() == [r["rule"] for r in ref]
    for b, r in enumerate(ref):
        want = r["logprob"]
        got = float(result.logprob[b])
        assert abs(got - want) <= 1e-4 + 1e-5 * abs(want), (b, got, want)
        for name in ir["features"]:
            want = r["features"][name]
            got = float(result.features[name][b])
            assert abs(got - want) <= 2e-5 + 1e-5 * abs(want), (name, b, got, want)


def test_cases_cover_every_feature_and_operation():
    irs = [make() for make in CASES.values()] + [with_router()]
    ops = {n["op"] for ir in irs for n in ir["nodes"]}
    feats = {n["name"] for ir in irs for n in ir["nodes"] if n["op"] == "feature"}
    assert ops == set(ARITY)
    assert feats == set(FEATURES)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inputs", ["random", "ties", "extreme"])
def test_torch_renderer_matches_python(case, dtype, inputs):
    ir = CASES[case]()
    kernel = RouteKernel(plan_for(ir), "slm", "torch")
    rows, vocab = 8, 203
    make = {"random": random_logits, "ties": tie_logits, "extreme": extreme_logits}[inputs]
    logits = make(rows, vocab, seed=len(case)).to(dtype)
    state = mixed_state(rows, restricted=inputs != "extreme")
    result = kernel(logits, None, state, with_features=True)
    assert_matches(result, reference(ir, logits, state), ir)


def test_rules_fire_in_order_and_default_to_stay():
    ir = CASES["bernoulli_split"]()
    kernel = RouteKernel(plan_for(ir), "slm", "torch")
    rows = 4000
    state = RouteBatchState.make(rows, seed=list(range(rows)), position=7)
    rule = kernel(random_logits(rows, 16, 0), None, state).rule
    shares = [float((rule == r).float().mean()) for r in (0, 1, -1)]
    assert abs(shares[0] - 0.5) < 0.03 and abs(shares[1] - 0.3) < 0.03 and abs(shares[2] - 0.2) < 0.03


def test_hints_do_not_change_results():
    ir = CASES["citer_like"]()
    kernel = RouteKernel(plan_for(ir), "slm", "torch")
    logits = random_logits(8, 99, 3)
    state = mixed_state(8)
    base = kernel(logits, None, state)
    state.any_sampling, state.any_restricted = True, True
    hinted = kernel(logits, None, state)
    assert torch.equal(base.token, hinted.token) and torch.equal(base.rule, hinted.rule)
    greedy = RouteBatchState.make(8)
    greedy.any_sampling = False
    assert torch.equal(kernel(logits, None, greedy).token, logits.argmax(-1))


def test_margin_is_exactly_zero_on_a_tie():
    ir = CASES["bools_and_ties"]()
    kernel = RouteKernel(plan_for(ir), "slm", "torch")
    logits = torch.tensor([[1.0, 5.0, 2.0, 5.0], [1.0, 5.0, 2.0, 4.0]])
    result = kernel(logits, None, RouteBatchState.make(2), with_features=True)
    assert result.token.tolist() == [1, 1]
    assert float(result.features["margin"][0]) == 0.0
    assert result.rule.tolist()[0] == 0


def test_features_count_the_token_just_sampled():
    b = IR()
    b.rule(b.op("eq", b.feature("run_length"), b.const(1)), "a")
    ir = b.build()
    ir["features"] = ["generated", "position", "run_length"]
    kernel = RouteKernel(plan_for(ir), "slm", "torch")
    state = RouteBatchState.make(2, position=[10, 20], run_length=[0, 3], generated=[4, 9])
    result = kernel(random_logits(2, 10, 0), None, state, with_features=True)
    assert result.features["run_length"].tolist() == [1, 4]
    assert result.features["generated"].tolist() == [5, 10]
    assert result.features["position"].tolist() == [11, 21]
    assert result.rule.tolist() == [0, -1]


def test_norm_entropy_of_a_flat_row_is_one():
    ir = CASES["entropy_band"]()
    kernel = RouteKernel(plan_for(ir), "slm", "torch")
    result = kernel(torch.zeros(1, 1000), None, RouteBatchState.make(1), with_features=True)
    assert math.isclose(float(result.features["norm_entropy"][0]), 1.0, rel_tol=1e-5)


def test_make_fills_host_hints_and_seed_bits():
    st = RouteBatchState.make(
        3, seed=[2**64 - 1, None, 5], temperature=[0.0, 0.5, 0.0], top_p=[0.9, 1.0, 1.0]
    )
    assert st.seed.tolist() == [-1, 0, 5]
    assert st.any_sampling is True and st.any_restricted is False  # top_p on a greedy row restricts nothing
    st = RouteBatchState.make(2, temperature=[0.0, 0.7], top_k=[0, 4])
    assert st.any_restricted is True
    with pytest.raises(ValueError, match="position has 3 values for 2 rows"):
        RouteBatchState.make(2, position=[1, 2, 3])


def test_empty_batch():
    kernel = RouteKernel(plan_for(CASES["citer_like"]()), "slm", "torch")
    result = kernel(torch.zeros(0, 10), None, RouteBatchState.make(0))
    assert result.token.shape == (0,) and result.rule.dtype == torch.int32
