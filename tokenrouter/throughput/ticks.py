"""Step latencies in ticks of δ, the unit the chain counts time in, and the chain's error: shared by the chain
(`dtmc.py`) and the fixed points around it (`colocation.py`, `prefill.py`)."""

from __future__ import annotations

import math

from tokenrouter.throughput.inputs import StepLatency, SystemInputs


class ChainError(ValueError):
    """The chain cannot be built or solved for these inputs (the message says why)."""


def step_ticks(inputs: SystemInputs, delta_ms: float) -> list[list[int]]:
    """`ℓ_i(b)` in ticks for b = 0..N (index 0 unused)."""
    if not (isinstance(delta_ms, (int, float)) and math.isfinite(delta_ms) and delta_ms > 0):
        raise ValueError(f"δ must be a finite number of ms > 0, got {delta_ms!r}")
    return [_ticks(s, inputs.concurrency, delta_ms) for s in inputs.step]


def alone_ticks(inputs: SystemInputs, delta_ms: float) -> list[list[int] | None]:
    """Each model's step in ticks while none of its co-runners runs (`AloneLatency`), None where it has none."""
    lone = inputs.alone or (None,) * inputs.n_models
    return [None if a is None else _ticks(a.step, inputs.concurrency, delta_ms) for a in lone]


def _ticks(step: StepLatency, n: int, delta_ms: float) -> list[int]:
    """`ℓ(b) = max(1, round(L(b) / δ))` for b = 0..n (index 0 unused)."""
    return [0] + [max(1, round(step.at(b) / delta_ms)) for b in range(1, n + 1)]
