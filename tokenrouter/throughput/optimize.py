"""The search for B* = argmax T(B) over B ∈ {1..N}^M with Σ(B_i − 1) < N, some B_i fixed.

Up to `exhaustive_limit` feasible candidates whose chains are small enough, alone and together (`large_n.chain_fits`),
every one is one chain (`dtmc.analyze`), solved exactly. Otherwise (two models past N ≈ 10, three past N ≈ 6, or
one candidate of a large N) the chains are too many or too large to solve in seconds, and the search samples them
instead (`large_n.py`); the result's method says which.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Mapping

from tokenrouter.compiler.passes.check_feasibility import feasibility_error
from tokenrouter.throughput.dtmc import (
    DEFAULT_DELTA_MS,
    DEFAULT_MAX_STATES,
    ChainError,
    ChainResult,
    analyze,
    too_many_states,
)
from tokenrouter.throughput.inputs import SystemInputs
from tokenrouter.throughput.tune_result import TuneResult, count_feasible, feasible


class TuneError(ValueError):
    """Thresholds cannot be tuned for these inputs (the message says why)."""


def candidates(m: int, n: int, fixed: Mapping[int, int]) -> list[tuple[int, ...]]:
    """All B ∈ {1..N}^M with Σ(B_i − 1) < N and B_i = fixed[i] where given, in lexicographic order."""
    ranges = [[fixed[i]] if i in fixed else range(1, n + 1) for i in range(m)]
    return [b for b in itertools.product(*ranges) if feasible(b, n)]


def fixed_indices(inputs: SystemInputs, fixed: Mapping[str, int] | None) -> dict[int, int]:
    """The fixed thresholds by model index, each checked to be an int >= 1 of one of the models, and all together
    to leave a feasible choice at N (TuneError otherwise)."""
    fixed = dict(fixed or {})
    for name, b in fixed.items():
        inputs.index(name)
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise TuneError(f"the fixed threshold of {name} must be an int >= 1, got {b!r}")
    if error := feasibility_error(fixed, inputs.concurrency):
        raise TuneError(error)
    return {inputs.index(k): v for k, v in fixed.items()}


def tune(
    inputs: SystemInputs,
    fixed: Mapping[str, int] | None = None,
    delta_ms: float = DEFAULT_DELTA_MS,
    max_states: int = DEFAULT_MAX_STATES,
    exhaustive_limit: int = 200,
) -> TuneResult:
    """Evaluate T(B) over the feasible thresholds and return them best first."""
    n, m = inputs.concurrency, inputs.n_models
    fixed_idx = fixed_indices(inputs, fixed)
    n_feasible = count_feasible(m - len(fixed_idx), n - sum(v - 1 for v in fixed_idx.values()))
    from tokenrouter.throughput.large_n import chain_fits, tune_sampled  # the one hook to `large_n`

    t0 = time.perf_counter()
    if n_feasible > exhaustive_limit or not chain_fits(inputs, fixed_idx, delta_ms, n_feasible):
        sampled = tune_sampled(inputs, fixed_idx, delta_ms)  # too many chains, or too large: sample them
        return dataclasses.replace(sampled, seconds=time.perf_counter() - t0)
    if error := too_many_states(inputs, max_states):
        raise TuneError(error)
    return _tune_exhaustive(inputs, fixed_idx, n_feasible, delta_ms, max_states, t0)


def _tune_exhaustive(
    inputs: SystemInputs,
    fixed_idx: dict[int, int],
    n_feasible: int,
    delta_ms: float,
    max_states: int,
    t0: float,
) -> TuneResult:
    """`tune` by the chain of every feasible candidate (`t0`: when the tuning began)."""
    pool = candidates(inputs.n_models, inputs.concurrency, fixed_idx)
    results, failed = _evaluate(inputs, pool, delta_ms, max_states)
    if not results:
        first = next(iter(failed.values()), "no feasible thresholds")
        raise TuneError(f"no candidate thresholds could be evaluated: {first}")
    return TuneResult(
        models=inputs.models,
        concurrency=inputs.concurrency,
        delta_ms=delta_ms,
        fixed={inputs.models[i]: v for i, v in sorted(fixed_idx.items())},
        method="exhaustive",
        n_feasible=n_feasible,
        results=results,
        failed=failed,
        seconds=time.perf_counter() - t0,
    )


def _evaluate(inputs: SystemInputs, thresholds, delta_ms: float, max_states: int):
    """The chain at each of the thresholds: the results best first (in the order evaluated among equals), and
    why each that failed did."""
    done: dict[tuple[int, ...], ChainResult | None] = {}
    failed: dict[tuple[int, ...], str] = {}
    for b in thresholds:
        if b in done:
            continue
        try:
            done[b] = analyze(inputs, b, delta_ms, max_states)
        except ChainError as exc:
            done[b] = None
            failed[b] = str(exc)
    return sorted((r for r in done.values() if r is not None), key=lambda r: -r.throughput), failed
