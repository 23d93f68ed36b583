"""The inputs of the throughput model: a closed system of M models and N requests.

`SystemInputs` is what the DTMC (`dtmc.py`) and the simulator (`simulate.py`) read: per model a step
latency `L_i(b)` (ms, by batch size b), the routing matrix `p[i][j]` (after one step at model i, the
probability that the request's next step is at model j; `p[i][i]` = it stays), the committed tokens
`c[i][j]` of that transition (1 for a kept token, 0 for a dropped one), the concurrency N and the entry
model. Routing is geometric: every step's decision is independent of the past. Optionally a model's steps
get longer while the models beside it on its GPU are busy: by their average utilization (`ColocationTerm`,
solved in `colocation.py`), or by whether one of them is running when the step starts (`AloneLatency`, which
the chain and the simulator apply step by step). A model's prompt prefills can be priced apart from its step
latency (`PrefillCost`): the chain spreads them over its steps, the simulator adds them to the steps that run
a request at the model for the first time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tokenrouter.compiler.passes.check_options import MAX_CONCURRENCY  # a plan's bound, -n's too


@dataclass(slots=True, frozen=True)
class StepLatency:
    """A model's step latency in ms as a function of the batch size b: linear between the measured
    points, constant beyond the last (and before the first) one. One point = a constant latency."""

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a step latency needs at least one (batch, ms) point")
        seen = set()
        for b, ms in self.points:
            if not isinstance(b, int) or isinstance(b, bool) or b < 1:
                raise ValueError(f"step latency batch size must be an int >= 1, got {b!r}")
            if b in seen:
                raise ValueError(f"step latency lists batch size {b} twice")
            seen.add(b)
            if not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0):
                raise ValueError(f"step latency must be a finite number of ms > 0, got {ms!r} at batch {b}")
        object.__setattr__(self, "points", tuple(sorted((b, float(ms)) for b, ms in self.points)))

    @classmethod
    def constant(cls, ms: float) -> StepLatency:
        return cls(((1, ms),))

    def at(self, b: int) -> float:
        pts = self.points
        if b <= pts[0][0]:
            return pts[0][1]
        for (b0, l0), (b1, l1) in zip(pts, pts[1:], strict=False):
            if b <= b1:
                return l0 + (l1 - l0) * (b - b0) / (b1 - b0)
        return pts[-1][1]

    def shifted(self, ms: float, floor_ms: float = 0.0) -> StepLatency:
        """The latency moved by `ms` at every batch size (never below `floor_ms`); itself where `ms` is 0."""
        return StepLatency(tuple((b, max(floor_ms, x + ms)) for b, x in self.points)) if ms else self

    def describe(self) -> str:
        if len(self.points) == 1:
            return f"{self.points[0][1]:g} ms"
        return ", ".join(f"b={b}: {ms:g} ms" for b, ms in self.points)


@dataclass(slots=True, frozen=True)
class ColocationTerm:
    """Model i shares a GPU with `co_runners` (model indices): its step takes
    `L_i(b) + ms_per_share × (Σ_j U_j − at_share)`, U_j the co-runners' utilization (their share of time in
    steps) and `at_share` its sum when L_i(b) was measured. Fitted by `tokenrouter profile --colocation`."""

    co_runners: tuple[int, ...]
    ms_per_share: float
    at_share: float

    def __post_init__(self) -> None:
        if not self.co_runners:
            raise ValueError("a co-location term needs at least one co-runner")
        for name, v in (("ms_per_share", self.ms_per_share), ("at_share", self.at_share)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"co-location {name} must be a finite number >= 0, got {v!r}")


@dataclass(slots=True, frozen=True)
class AloneLatency:
    """Model i shares a GPU with `co_runners` (model indices). A step it starts while none of them is running
    (counting the steps that start at the same moment) takes `step`; one it starts while any of them is takes
    the model's own latency, which is then the latency measured beside them (a served eager profile). With
    delayed batching the two alternate by state: at N = 8 and B_llm = 5, the 0.6B's steps of 4-8 rows find
    the 8B waiting to gather its batch. With two models a step
    started alone stays alone (the other starts only on hops that steps send when they end); the busy board
    measures `step` from the steps that no co-runner step overlapped."""

    co_runners: tuple[int, ...]
    step: StepLatency

    def __post_init__(self) -> None:
        if not self.co_runners:
            raise ValueError("a latency alone needs at least one co-runner")


@dataclass(slots=True, frozen=True)
class PrefillCost:
    """Model i's prompt prefills, priced apart from its step latency `L_i(b)` (which then holds the steps
    without them): the steps whose longest row ran more new tokens than the engine's CUDA graphs hold took
    this much longer than a step of their batch size (`from_metrics`).
    `ms_per_token`: those ms per token the whole system committed; the chain adds `ms_per_token` × (tokens the
    system commits per step of i) to every step of i, at its own fixed point (`prefill.py`). `ms_per_visit`:
    the same ms per request that reached model i, which the simulator adds to each step for every request
    that runs there for the first time (None: not known, and the simulator prices no prefill of i)."""

    ms_per_token: float
    ms_per_visit: float | None = None

    def __post_init__(self) -> None:
        check_prefill_ms("ms_per_token", self.ms_per_token)
        if self.ms_per_visit is not None:
            check_prefill_ms("ms_per_visit", self.ms_per_visit)


def check_prefill_ms(name: str, v) -> None:
    """A prefill cost's field (`PrefillCost`, and a profile's `prefill`): a finite number of ms >= 0."""
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
        raise ValueError(f"prefill {name} must be a finite number of ms >= 0, got {v!r}")


@dataclass(slots=True)
class SystemInputs:
    models: tuple[str, ...]
    step: tuple[StepLatency, ...]
    p: np.ndarray  # M x M routing probabilities, rows sum to 1
    c: np.ndarray  # M x M committed tokens per transition
    concurrency: int
    entry: int = 0
    colocation: tuple[ColocationTerm | None, ...] = ()  # per model, or () for none
    alone: tuple[AloneLatency | None, ...] = ()  # per model, or () for none
    prefill: tuple[PrefillCost | None, ...] = ()  # per model, or () for none

    def __post_init__(self) -> None:
        m = len(self.models)
        self._check_sizes()
        self._check_matrices()
        self.colocation = self._per_model(self.colocation, "co-location terms")
        self.alone = self._per_model(self.alone, "latencies alone")
        self.prefill = tuple(self.prefill)
        if self.prefill and len(self.prefill) != m:
            raise ValueError(f"expected {m} prefill costs (None where a model has none)")
        if any(t is not None for t in self.colocation) and any(a is not None for a in self.alone):
            raise ValueError(
                "give a model's contention either as a co-location term or as a latency alone, not both"
            )

    def _check_sizes(self) -> None:
        """The models (distinct, one latency each), the concurrency and the entry model."""
        m = len(self.models)
        if m < 1:
            raise ValueError("the system needs at least one model")
        if len(set(self.models)) != m:
            raise ValueError(f"model names must be distinct, got {list(self.models)}")
        if len(self.step) != m:
            raise ValueError(f"expected {m} step latencies, got {len(self.step)}")
        if (
            not isinstance(self.concurrency, int)
            or isinstance(self.concurrency, bool)
            or not 1 <= self.concurrency <= MAX_CONCURRENCY
        ):
            raise ValueError(
                f"concurrency N must be an int in [1, {MAX_CONCURRENCY}], got {self.concurrency!r}"
            )
        if not (isinstance(self.entry, int) and 0 <= self.entry < m):
            raise ValueError(f"entry must be a model index in 0..{m - 1}, got {self.entry!r}")

    def _check_matrices(self) -> None:
        """p and c as M x M float arrays, finite; p's rows probabilities summing to 1 (renormalized), c >= 0."""
        m = len(self.models)
        self.p = np.asarray(self.p, dtype=float)
        self.c = np.asarray(self.c, dtype=float)
        for name, mat in (("p", self.p), ("c", self.c)):
            if mat.shape != (m, m):
                raise ValueError(f"{name} must be {m}x{m}, got shape {mat.shape}")
            if not np.all(np.isfinite(mat)):
                raise ValueError(f"{name} has a non-finite entry")
        if np.any(self.p < -1e-12) or np.any(self.p > 1 + 1e-12):
            raise ValueError("routing probabilities must lie in [0, 1]")
        for i, row in enumerate(self.p):
            if abs(row.sum() - 1.0) > 1e-6:
                raise ValueError(
                    f"routing probabilities from {self.models[i]} sum to {row.sum():.6g}, expected 1"
                )
        self.p = np.clip(self.p, 0.0, 1.0)
        self.p /= self.p.sum(axis=1, keepdims=True)
        if np.any(self.c < 0):
            raise ValueError("committed tokens c must be >= 0")

    def _per_model(self, items, what: str) -> tuple:
        """`items` (a co-location term or a latency alone per model, None where a model has none; or none
        at all) as a tuple, checked: one per model, each naming other models as its co-runners."""
        items, m = tuple(items), len(self.models)
        if items and len(items) != m:
            raise ValueError(f"expected {m} {what} (None where a model has none)")
        for i, item in enumerate(items):
            if item is not None and any(not 0 <= j < m or j == i for j in item.co_runners):
                raise ValueError(f"co-runners of {self.models[i]} must be other models' indices")
        return items

    def prefill_at(self, i: int) -> PrefillCost | None:
        """Model i's prefill cost, None where it has none."""
        return self.prefill[i] if self.prefill else None

    def step_alone(self, i: int, running: Sequence[bool]) -> bool:
        """Whether model i, starting a step while `running[j]` says which models run, takes its latency
        alone (it has one and none of its co-runners is running)."""
        lone = self.alone[i] if self.alone else None
        return lone is not None and not any(running[j] for j in lone.co_runners)

    def step_at(self, i: int, b: int, running: Sequence[bool]) -> float:
        """Model i's step latency at batch b, started while `running` says which models run."""
        return self.alone[i].step.at(b) if self.step_alone(i, running) else self.step[i].at(b)

    @property
    def n_models(self) -> int:
        return len(self.models)

    def index(self, model: str) -> int:
        try:
            return self.models.index(model)
        except ValueError:
            raise ValueError(f"unknown model {model!r} (models: {', '.join(self.models)})") from None

    def tokens_per_step(self) -> np.ndarray:
        """Expected committed tokens per request-step at each model: Σ_j p_ij c_ij."""
        return (self.p * self.c).sum(axis=1)


def with_step_ms(inputs: SystemInputs, add: Sequence[float]) -> SystemInputs:
    """`inputs` with `add[i]` ms on every step latency of model i, alone or beside: a host gap that each step
    takes beyond its forward (`tune --gap-ms`), or a prefill cost spread over the steps (`prefill.py`)."""
    if len(add) != inputs.n_models:
        raise ValueError(f"expected {inputs.n_models} step additions, got {len(add)}")
    step = tuple(s.shifted(d) for s, d in zip(inputs.step, add, strict=True))
    alone = tuple(
        dataclasses.replace(a, step=a.step.shifted(d)) if a is not None else None
        for a, d in zip(inputs.alone or (None,) * inputs.n_models, add, strict=True)
    )
    return dataclasses.replace(inputs, step=step, alone=alone if inputs.alone else ())


def make_inputs(
    models: Sequence[str],
    step_ms: Mapping[str, float | StepLatency],
    p: Sequence[Sequence[float]],
    c: Sequence[Sequence[float]],
    concurrency: int,
    entry: str | None = None,
) -> SystemInputs:
    """Convenience constructor from names: `step_ms` maps each model to ms or a `StepLatency`."""
    models = tuple(models)
    missing = [m for m in models if m not in step_ms]
    if missing:
        raise ValueError(f"no step latency for {', '.join(missing)}")
    step = tuple(
        s if isinstance(s, StepLatency) else StepLatency.constant(float(s))
        for s in (step_ms[m] for m in models)
    )
    e = 0 if entry is None else models.index(entry) if entry in models else -1
    if e < 0:
        raise ValueError(f"entry {entry!r} is not one of the models")
    return SystemInputs(models, step, np.array(p, float), np.array(c, float), concurrency, e)
