"""Pinned outputs: seeded `simulate()` runs and fast chain builds (`chain_fast`) over the features they cover
give these results to the bit. The digests were taken from the simulator and the chain before they were split
into named steps; a change to either that moves any figure, however little, fails here."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from tokenrouter.throughput.dtmc import build_chain
from tokenrouter.throughput.inputs import AloneLatency, PrefillCost, StepLatency, make_inputs
from tokenrouter.throughput.simulate import SimConfig, simulate


def two(n: int, **extra):
    step = {
        "slm": StepLatency(((1, 1.0), (4, 1.2), (16, 2.0), (64, 3.5))),
        "llm": StepLatency(((1, 5.0), (8, 6.0), (64, 9.0))),
    }
    inputs = make_inputs(["slm", "llm"], step, [[0.8, 0.2], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]], n)
    for k, v in extra.items():
        setattr(inputs, k, v)
    return inputs


def three(n: int):
    p = [[0.7, 0.2, 0.1], [0.5, 0.4, 0.1], [0.6, 0.0, 0.4]]
    c = [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    return make_inputs(["a", "b", "c"], {"a": 1.0, "b": 3.0, "c": 3.0}, p, c, n)


_rng = np.random.default_rng(7)
REQUESTS = tuple(np.array([[1 - q, q], [1.0, 0.0]]) for q in _rng.uniform(0, 0.5, 40))
LENGTHS = tuple(int(k) for k in _rng.integers(20, 120, 40))
ARRIVALS = tuple(float(x) for x in np.cumsum(_rng.exponential(8.0, 300)))
ALONE = (
    AloneLatency((1,), StepLatency(((1, 0.6), (16, 1.5)))),
    AloneLatency((0,), StepLatency.constant(4.0)),
)
PREFILL = (PrefillCost(0.05, 2.5), PrefillCost(0.2, 9.0))

SIM_CASES = {
    "endless, hops": (three(12), dict(thresholds=(1, 2, 3), horizon_ms=3000, hop_ms=(0.1, 0.2, 0.0))),
    "endless, many rows": (two(96), dict(thresholds=(8, 20), horizon_ms=2000, seed=3)),
    "think times": (
        two(10),
        dict(thresholds=(1, 4), horizon_ms=4000, request_tokens=30, think_ms=3.0, burstiness=4.0, max_delay_ms=20),
    ),
    "exponential think times, many rows": (
        two(80),
        dict(thresholds=(4, 16), horizon_ms=3000, request_tokens=50, think_ms=5.0, hop_ms=(0.2, 0.4), seed=1),
    ),
    "open loop with a backlog": (
        two(6),
        dict(thresholds=(1, 2), horizon_ms=6000, request_tokens=40, arrival_rate_per_s=80.0, max_delay_ms=20,
             hop_ms=(0.3, 0.3)),
    ),
    "open loop, many rows": (
        two(64),
        dict(thresholds=(2, 8), horizon_ms=3000, request_tokens=40, arrival_rate_per_s=400.0, max_delay_ms=15,
             gap_ms=(0.1, 0.3)),
    ),
    "arrivals given": (
        two(16),
        dict(thresholds=(1, 3), horizon_ms=4000, warmup_ms=0.0, request_tokens=25, arrivals_ms=ARRIVALS,
             max_delay_ms=10),
    ),
    "finite run": (
        two(5),
        dict(thresholds=(1, 2), request_tokens=60, requests=REQUESTS, request_lengths=LENGTHS, max_delay_ms=20,
             hop_ms=(0.5, 0.5)),
    ),
    "finite run, alike lengths": (
        two(40),
        dict(thresholds=(2, 6), request_tokens=30, requests=REQUESTS, hop_ms=(0.0, 0.5)),
    ),
    "no held rule": (
        two(8),
        dict(thresholds=(2, 3), horizon_ms=4000, request_tokens=25, held_rule=False, max_delay_ms=10),
    ),
    "held away": (
        two(12),
        dict(thresholds=(2, 5), horizon_ms=3000, request_tokens=40, max_delay_ms=30, held_away_ms=6.0),
    ),
    "held expect": (
        two(12),
        dict(thresholds=(2, 5), horizon_ms=3000, request_tokens=40, max_delay_ms=30, held_expect=0.7),
    ),
    "alone, prefills, gaps": (
        two(24, alone=ALONE, prefill=PREFILL),
        dict(thresholds=(3, 6), horizon_ms=3000, request_tokens=35, think_ms=1.0, gap_ms=(0.05, 0.2),
             max_delay_ms=25, seed=5),
    ),
    "stalled": (two(2), dict(thresholds=(3, 3), horizon_ms=1000, held_rule=False)),
}  # fmt: skip

CHAIN_CASES = {
    "two models": (two(6), (2, 3), 0.5),
    "three models": (three(5), (1, 2, 2), 0.5),
    "alone": (two(5, alone=ALONE), (1, 3), 0.25),
}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def sim_digest(inputs, cfg: dict) -> tuple[float, str]:
    """The run's throughput and a digest of its whole result (every figure, by its exact repr)."""
    result = simulate(inputs, SimConfig(**cfg)).as_dict(inputs.models)
    return result["throughput_tok_s"], _digest(result)


def chain_digest(inputs, thresholds, delta_ms: float) -> str:
    states, mat, reward, tau, done = build_chain(inputs, thresholds, delta_ms)
    mat = mat.tocsr()
    parts = (states, mat.data, mat.indices, mat.indptr, reward, tau, done)
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in parts)).hexdigest()[:16]


SIM_PINNED: dict[str, tuple[float, str]] = {
    "endless, hops": (4316.666666666666, "196a35f10db780c8"),
    "endless, many rows": (17291.0, "91aa333837998c06"),
    "think times": (3233.0, "7c1733aad12913e1"),
    "exponential think times, many rows": (15012.333333333334, "b2000ede6393ccc8"),
    "open loop with a backlog": (2125.5, "67a89afcd5c9c554"),
    "open loop, many rows": (12884.0, "0587e81eb8cf007f"),
    "arrivals given": (2942.513200390388, "076964f47e9462ab"),
    "finite run": (1510.9022052331504, "1ade6d0389b3b158"),
    "finite run, alike lengths": (5666.239918604017, "3b2ff343b95a7e1b"),
    "no held rule": (2754.25, "0fa6de947e9afb05"),
    "held away": (3833.666666666667, "d8115f141af39def"),
    "held expect": (3846.6666666666665, "0608fdc766127d77"),
    "alone, prefills, gaps": (2541.333333333333, "aa7fdcda632c1b68"),
    "stalled": (0.0, "fc6391503d3bbd4a"),
}
CHAIN_PINNED: dict[str, str] = {
    "two models": "e0e7b28bd1087377",
    "three models": "dcb0f017810b5beb",
    "alone": "81d24bf84e2b5c4b",
}


@pytest.mark.parametrize("name", SIM_CASES)
def test_simulate_pinned(name):
    assert sim_digest(*SIM_CASES[name]) == SIM_PINNED[name]


@pytest.mark.parametrize("name", CHAIN_CASES)
def test_fast_chain_pinned(name):
    assert chain_digest(*CHAIN_CASES[name]) == CHAIN_PINNED[name]
