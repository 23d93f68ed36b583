"""Prompt prefills in the chain: each model's prefill cost spread over its steps, at the chain's fixed point.

A request's first step at a model runs its whole context (the prompt at the entry model; at another model,
everything written before its first hop there). With long prompts those steps are several times a decode
step: with 3,072-token prompts on the H200 the 8B's four prefills at 4 rows took
83 ms each against 6.6 for its other steps there. Left in the step latency of whatever batch size they fell
at, they make that batch size look slow and leave the others cheap; `from_metrics` takes them out and prices
them apart (`PrefillCost.ms_per_token`: ms per token the whole system committed).

The chain has no request that starts or ends, so it cannot put a prefill on a request's first visit. It
spreads the cost instead: every step of model i takes `κ_i × X / S_i` ms longer, with X the committed tokens
per second and S_i the steps of i per second that the chain itself predicts. Over a long run model i then
spends `κ_i` ms per committed token on prefill, as measured, whatever thresholds it runs at. X / S_i (the
tokens the system commits per step of i) changes little with the added time, so the iteration settles in
two or three solves; the chain sees only whole ticks, so a cost below half a tick per step changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tokenrouter.throughput.inputs import SystemInputs, with_step_ms
from tokenrouter.throughput.ticks import alone_ticks, step_ticks

_ROUNDS = 8
# a change in the added ms per step below this (or below 1 % of it) ends the iteration
_TOLERANCE_MS = 0.002


def has_prefill(inputs: SystemInputs) -> bool:
    return any(c is not None and c.ms_per_token > 0 for c in inputs.prefill)


def spread(inputs: SystemInputs, add: list[float]) -> SystemInputs:
    """`inputs` with `add[i]` ms on every step latency of model i (alone or beside), and no prefill cost."""
    return dataclasses.replace(with_step_ms(inputs, add), prefill=())


def solve(
    inputs: SystemInputs, thresholds: tuple[int, ...], chain: Callable, delta_ms: float, max_states: int
):
    """The chain (`chain(inputs, thresholds, delta_ms, max_states)` solves one) with each model's prefill cost
    spread over its steps at the fixed point; the result carries the ms it added per step (`prefill_ms`)."""
    kappa = [c.ms_per_token if c is not None else 0.0 for c in inputs.prefill]
    cache: dict = {}

    def run(add: list[float]):
        moved = spread(inputs, add)
        key = (
            tuple(map(tuple, step_ticks(moved, delta_ms))),
            tuple(tuple(t) if t is not None else None for t in alone_ticks(moved, delta_ms)),
        )  # the chain sees only the ticks
        if key not in cache:
            cache[key] = chain(moved, thresholds, delta_ms, max_states)
        return cache[key]

    add = [0.0] * inputs.n_models
    res = run(add)
    for _ in range(_ROUNDS):
        new = [
            k * res.throughput / s if k > 0 and s > 0 else 0.0
            for k, s in zip(kappa, res.steps_per_s, strict=True)
        ]
        if all(abs(a - b) <= max(_TOLERANCE_MS, 0.01 * b) for a, b in zip(new, add, strict=True)):
            break
        add = new
        res = run(add)
    return dataclasses.replace(res, prefill_ms=tuple(round(d, 4) for d in add))
