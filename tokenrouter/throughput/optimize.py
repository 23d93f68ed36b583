"""The search for B* = argmax T(B) over B ∈ {1..N}^M with Σ(B_i − 1) < N, some B_i fixed.

Up to `exhaustive_limit` feasible candidates whose largest chain is small enough (`large_n.chain_fits`), every one
is one chain (`dtmc.analyze`), solved exactly. Otherwise (two models past N ≈ 19, three past N ≈ 10, or one
candidate of a large N) the chains are too many or too large to solve, and the search samples them instead
(`large_n.py`); the result's method says which.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from tokenrouter.compiler.passes.check_feasibility import feasibility_error
from tokenrouter.compiler.throughput.dtmc import (
    DEFAULT_DELTA_MS,
    DEFAULT_MAX_STATES,
    ChainError,
    ChainResult,
    analyze,
    too_many_states,
)
from tokenrouter.compiler.throughput.inputs import SystemInputs


class TuneError(ValueError):
    """Thresholds cannot be tuned for these inputs (the message says why)."""


@dataclass(slots=True)
class TuneResult:
    models: tuple[str, ...]
    concurrency: int
    delta_ms: float
    fixed: dict[str, int]
    method: str  # "exhaustive" (every chain solved) or `large_n.METHOD` (sampled)
    n_feasible: int  # size of the feasible candidate set
    results: list[ChainResult] = field(default_factory=list)  # evaluated candidates, best first
    failed: dict[tuple[int, ...], str] = field(default_factory=dict)  # candidates whose chain failed
    seconds: float = 0.0
    sampling: dict | None = None  # the sampled search's settings (`large_n.py`); None: every chain solved
    chosen: int = (
        0  # index in `results` of the candidate chosen (0, the chain's best, unless `tune` kept another)
    )

    @property
    def best(self) -> ChainResult:
        return self.results[self.chosen]

    def best_thresholds(self) -> dict[str, int]:
        return dict(zip(self.models, self.best.thresholds, strict=True))

    def as_dict(self, top: int | None = None) -> dict:
        shown = self.results if top is None else self.results[:top]
        return {
            "concurrency": self.concurrency,
            "delta_ms": self.delta_ms,
            "fixed": dict(self.fixed),
            "method": self.method,
            "feasible_candidates": self.n_feasible,
            "evaluated": len(self.results) + len(self.failed),
            "best": self.best_thresholds(),
            "throughput_tok_s": self.best.throughput,
            "seconds": round(self.seconds, 3),
            "candidates": [r.as_dict(self.models) for r in shown],
            "failed": {",".join(map(str, b)): msg for b, msg in self.failed.items()},
            **({"sampling": self.sampling} if self.sampling else {}),
        }


def feasible(b: tuple[int, ...], n: int) -> bool:
    return sum(x - 1 for x in b) < n


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
    from tokenrouter.compiler.throughput.large_n import chain_fits, tune_sampled  # the one hook to `large_n`

    t0 = time.perf_counter()
    if n_feasible > exhaustive_limit or not chain_fits(inputs, fixed_idx, delta_ms):
        sampled = tune_sampled(inputs, fixed_idx, delta_ms)  # too many chains, or too large: sample them
        return dataclasses.replace(sampled, seconds=time.perf_counter() - t0)
    if error := too_many_states(inputs, max_states):
        raise TuneError(error)
    cache: dict[tuple[int, ...], ChainResult | None] = {}
    failed: dict[tuple[int, ...], str] = {}

    def value(b: tuple[int, ...]) -> float:
        if b not in cache:
            try:
                cache[b] = analyze(inputs, b, delta_ms, max_states)
            except ChainError as exc:
                cache[b] = None
                failed[b] = str(exc)
        r = cache[b]
        return -1.0 if r is None else r.throughput

    for b in candidates(m, n, fixed_idx):
        value(b)
    results = sorted((r for r in cache.values() if r is not None), key=lambda r: -r.throughput)
    if not results:
        first = next(iter(failed.values()), "no feasible thresholds")
        raise TuneError(f"no candidate thresholds could be evaluated: {first}")
    return TuneResult(
        models=inputs.models,
        concurrency=n,
        delta_ms=delta_ms,
        fixed={inputs.models[i]: v for i, v in sorted(fixed_idx.items())},
        method="exhaustive",
        n_feasible=n_feasible,
        results=results,
        failed=failed,
        seconds=time.perf_counter() - t0,
    )


def count_feasible(k: int, budget: int) -> int:
    """Number of (x_1..x_k) ≥ 0 with Σ x < budget, each x ≤ N − 1 (implied): C(budget − 1 + k, k)."""
    if budget <= 0:
        return 0
    from math import comb

    return comb(budget - 1 + k, k)
