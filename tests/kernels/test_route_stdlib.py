"""Every stdlib policy, compiled: the torch renderer of each model's route block against the plain-Python
evaluation of the same IR."""

from __future__ import annotations

import pytest
import torch
from route_cases import STDLIB_HIDDEN, runnable_stdlib_plan, stdlib_policies
from route_inputs import extreme_logits, mixed_state, random_logits
from route_reference import reference
from test_route_torch import assert_matches

from tokenrouter.runtime.route import RouteKernel

POLICIES = stdlib_policies()


def test_there_are_stdlib_policies():
    assert len(POLICIES) >= 5, POLICIES


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_stdlib_policy_torch_matches_python(path, tmp_path):
    plan = runnable_stdlib_plan(path, tmp_path)
    table = torch.randn(160, STDLIB_HIDDEN, generator=torch.Generator().manual_seed(1))
    rows, vocab = 8, 160
    for model, ir in plan["routes"].items():
        kernel = RouteKernel(plan, model, "torch", embed=lambda t: table[t], hidden_size=STDLIB_HIDDEN)
        hidden = torch.randn(rows, STDLIB_HIDDEN, generator=torch.Generator().manual_seed(2))
        for logits in (random_logits(rows, vocab, 4), extreme_logits(rows, vocab, 5)):
            state = mixed_state(rows, position_base=30)
            result = kernel(logits, hidden if kernel.needs_hidden else None, state, with_features=True)
            router_out = (
                torch.stack([result.features[r] for r in ir["routers"]], 1) if ir["routers"] else None
            )
            assert_matches(result, reference(ir, logits, state, router_out), ir)
