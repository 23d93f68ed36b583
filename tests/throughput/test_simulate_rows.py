"""The simulator routes a step's rows one by one, or at once with numpy where a step has many
(`simulate._ROWS_AT_ONCE`). Both keep the same bookkeeping in the same order, so a seeded run gives the same
result either way, to the bit."""

from __future__ import annotations

import numpy as np
import pytest

import tokenrouter.throughput.simulate as sim
from tokenrouter.throughput.inputs import StepLatency, make_inputs


def two(n: int):
    step = {
        "slm": StepLatency(((1, 1.0), (4, 1.2), (16, 2.0))),
        "llm": StepLatency(((1, 5.0), (8, 6.0))),
    }
    return make_inputs(["slm", "llm"], step, [[0.8, 0.2], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]], n)


def three(n: int):
    p = [[0.7, 0.2, 0.1], [0.5, 0.4, 0.1], [0.6, 0.0, 0.4]]
    c = [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    return make_inputs(["a", "b", "c"], {"a": 1.0, "b": 3.0, "c": 3.0}, p, c, n)


rng = np.random.default_rng(1)
REQUESTS = tuple(np.array([[1 - q, q], [1.0, 0.0]]) for q in rng.uniform(0, 0.5, 30))
LENGTHS = tuple(int(k) for k in rng.integers(20, 120, 30))
CASES = {
    "endless, hops": (three(12), dict(thresholds=(1, 2, 3), horizon_ms=3000, hop_ms=(0.1, 0.2, 0.0))),
    # b and c step alike and send hops to a alike: hops from two steps arrive at one instant
    "think times": (
        two(10),
        dict(
            thresholds=(1, 4),
            horizon_ms=4000,
            request_tokens=30,
            think_ms=3.0,
            burstiness=4.0,
            max_delay_ms=20,
        ),
    ),
    "open loop with a backlog": (
        two(6),
        dict(
            thresholds=(1, 2),
            horizon_ms=6000,
            request_tokens=40,
            arrival_rate_per_s=80.0,
            max_delay_ms=20,
            hop_ms=(0.3, 0.3),
        ),
    ),  # fmt: skip
    "finite run": (
        two(5),
        dict(
            thresholds=(1, 2),
            request_tokens=60,
            requests=REQUESTS,
            request_lengths=LENGTHS,
            max_delay_ms=20,
            hop_ms=(0.5, 0.5),
        ),
    ),  # fmt: skip
    "no held rule": (
        two(8),
        dict(thresholds=(2, 3), horizon_ms=4000, request_tokens=25, held_rule=False, max_delay_ms=10),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_rows_at_once_match_rows_one_by_one(name, monkeypatch):
    inputs, cfg = CASES[name]
    results = []
    for at_once in (1, 10**9):
        monkeypatch.setattr(sim, "_ROWS_AT_ONCE", at_once)
        results.append(sim.simulate(inputs, sim.SimConfig(**cfg)).as_dict(inputs.models))
    assert results[0] == results[1]
    assert results[0]["throughput_tok_s"] > 0
