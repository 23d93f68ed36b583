"""Delayed batching: when a subserver runs its next step.

Subserver i runs a step when

1. at least `B_i^eff` requests are runnable on it, or
2. the oldest runnable request has waited at least `max_delay_ms` (unless the timeout is disabled).

**The threshold rule.** `B_i` comes from the plan (`models.*.batch`: an int, or `"auto"`, read as 1 until the
throughput model resolves it). With n active requests (published by the frontend), every subserver computes
the same vector `B^eff` from the same inputs: start from `B`; while `Σ_i (B_i^eff − 1) ≥ max(n, 1)`, lower
by one the largest `B_j^eff`, the first such j in the plan's model order on ties. The result is the unique
fixed point of that procedure, so subservers that agree on n agree on `B^eff`, and it satisfies
`Σ_i (B_i^eff − 1) < n` for every n ≥ 1 (all ones give 0).

Why it cannot stall: each active request is runnable on exactly one subserver, pending on others, or in
flight in a message. If no subserver could run, every subserver i would hold at most `B_i^eff − 1` runnable
requests, so at most `Σ (B_i^eff − 1) < n` would be runnable in all, and some request would be in flight —
its arrival changes the counts. A stale n (higher than the truth, e.g. before an `ActiveCount` arrives) can
delay a step, but the `max_delay_ms` timeout bounds that delay.

**Nobody else to wait for.** A subserver also runs when every request it holds is runnable (`held`): it
holds a request from the request's first visit until it ends, also while the request is away (pending), so
with all of them runnable no row it knows of can join the batch, and waiting would only spend the timeout.
Where routing is spread over the requests (every request visits every model within a few tokens) this fires
only around a request's start; where it concentrates in a few requests (an untrained router that fires on
some prompts) it keeps a model that one or two requests visit from holding each of their hops for
`max_delay_ms`: on the H200 the r2r policy at B_llm = 2 served 0.82x eager when every such hop waited.
It only lowers the bar for a step, so the argument below still holds.

**Which n.** The frontend numbers every change of n (`count_seq`), and a subserver keeps the count with the
highest number it has seen, from an `ActiveCount`, a `NewRequest` or a hop (which carries its sender's count):
a hop can bring a newer count than the subserver's own, but never an older one. (Taking a hop's count
whenever it is lower is wrong: a hop carrying its sender's count from before the latest arrivals would lower
the large model's threshold to 1 for as long as n did not change again; on the H200 half of the 8B's steps at
B_llm = 4-5 ran below the threshold that way, and on the CPU 219 of 333 steps with 8 requests active.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

START_REASONS = ("threshold", "lowered", "held", "timeout")


def effective_thresholds(thresholds: dict[str, int], n_active: int) -> dict[str, int]:
    """The deterministic `B^eff` for `n_active` requests (see the module docstring). Order of `thresholds`
    matters for ties: pass the plan's model order."""
    eff = dict(thresholds)
    budget = max(n_active, 1) - 1  # Σ(B_eff − 1) must be ≤ n − 1
    excess = sum(b - 1 for b in eff.values()) - budget
    while excess > 0:
        name = max(eff, key=lambda k: eff[k])  # first of the largest, in order
        eff[name] -= 1
        excess -= 1
    return eff


def plan_thresholds(plan: dict) -> dict[str, int]:
    """`B_i` per model in plan order; `"auto"` is 1 until the throughput model writes an int."""
    out = {}
    for name, spec in plan["models"].items():
        b = spec.get("batch", "auto")
        out[name] = 1 if b == "auto" else int(b)
    return out


@dataclass(slots=True)
class BatchingConfig:
    thresholds: dict[str, int]  # B_i per model, in plan order
    max_delay_ms: float | None  # None: no timeout (only for tests of the threshold rule)

    def __post_init__(self) -> None:
        if not self.thresholds:
            raise ValueError("batching needs at least one model threshold")
        for name, b in self.thresholds.items():
            if not isinstance(b, int) or b < 1:
                raise ValueError(f"batch threshold of model {name!r} must be an int >= 1, got {b!r}")
        if self.max_delay_ms is not None and not (
            self.max_delay_ms >= 0 and math.isfinite(self.max_delay_ms)
        ):
            raise ValueError(f"max_delay_ms must be a finite number >= 0, got {self.max_delay_ms!r}")

    @classmethod
    def from_plan(cls, plan: dict) -> BatchingConfig:
        return cls(plan_thresholds(plan), float(plan.get("serve", {}).get("max_delay_ms", 5.0)))


class DelayedBatching:
    """One subserver's view: its threshold for the current n, and whether/when to run."""

    def __init__(self, config: BatchingConfig, model: str, n_active: int = 1) -> None:
        if model not in config.thresholds:
            raise ValueError(f"model {model!r} has no batch threshold")
        self.config = config
        self.model = model
        self.n_active = -1
        self.count_seq = 0
        self.threshold = 1
        self.set_active(n_active)

    def set_active(self, n_active: int, count_seq: int = 0) -> bool:
        """Take the frontend's count n unless it is older than the one held (a lower `count_seq`; 0 is
        unnumbered and always taken). Returns whether it was taken."""
        if count_seq:
            if count_seq < self.count_seq:
                return False
            self.count_seq = count_seq
        if n_active != self.n_active:
            self.n_active = n_active
            self.threshold = effective_thresholds(self.config.thresholds, n_active)[self.model]
        return True

    def start_reason(self, n_runnable: int, n_held: int | None = None) -> str:
        """Why a step that runs with `n_runnable` of the `n_held` requests this subserver holds runnable starts
        (one of START_REASONS; `n_held` None: not known, never "held")."""
        if n_runnable >= self.config.thresholds[self.model]:
            return "threshold"
        if n_runnable >= self.threshold:
            return "lowered"
        return "held" if n_held is not None and n_runnable >= n_held else "timeout"

    def should_run(
        self, n_runnable: int, oldest_ready_since: float | None, now: float, n_held: int | None = None
    ) -> bool:
        """Whether to run a step now: `n_runnable` requests runnable, the oldest since `oldest_ready_since`, of
        the `n_held` this subserver holds (runnable or pending; None: not known)."""
        if n_runnable == 0:
            return False
        if n_runnable >= self.threshold or (n_held is not None and n_runnable >= n_held):
            return True
        deadline = self.deadline(oldest_ready_since)
        return deadline is not None and now >= deadline

    def deadline(self, oldest_ready_since: float | None) -> float | None:
        """When the timeout makes the oldest runnable request run (None: nothing runnable, or no timeout)."""
        if oldest_ready_since is None or self.config.max_delay_ms is None:
            return None
        return oldest_ready_since + self.config.max_delay_ms / 1000.0
