"""`tune`'s check of a B* that the plan's `max_delay_ms` timeout will cut short (`timeout_warnings`).

The chain has no timeout, so it cannot say how such a B* serves: most of a model's batches may start on the
timeout with fewer rows, and the plan serve worse than before it was tuned. The simulator has the timeout:
B* and the plan's current thresholds are both simulated with it (the same inputs, a closed loop of N
requests, `HORIZON_MS` of simulated time), and the better is kept, B* where they are within `TIE` of each
other. `tune` says which, and why.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenrouter.throughput.inputs import SystemInputs
from tokenrouter.throughput.sim_config import SimConfig, steps_error
from tokenrouter.throughput.simulate import simulate

HORIZON_MS = 20_000.0
TIE = 0.01  # a relative difference of simulated throughput taken as noise


@dataclass(frozen=True, slots=True)
class TimeoutCheck:
    models: tuple[str, ...]
    best: tuple[int, ...]  # the chain's B*
    current: tuple[int, ...]  # the plan's thresholds (auto as 1)
    best_tok_s: float  # simulated, with the timeout
    current_tok_s: float
    max_delay_ms: float

    @property
    def keep_current(self) -> bool:
        return self.current_tok_s > self.best_tok_s * (1.0 + TIE)

    def simulated(self) -> str:
        """What the simulation found, for a message."""

        def name(b: tuple[int, ...]) -> str:
            return "(" + ", ".join(f"{m} {x}" for m, x in zip(self.models, b, strict=True)) + ")"

        return (
            f"the chain has no timeout; simulated with max_delay_ms = {self.max_delay_ms:g}, its B* "
            f"{name(self.best)} serves {self.best_tok_s:.1f} tok/s and the plan's setting {name(self.current)} "
            f"{self.current_tok_s:.1f}"
        )

    def line(self) -> str:
        """What was found and which setting is kept."""
        if self.keep_current:
            return f"{self.simulated()}: the plan's setting is kept"
        tie = " (within 1 %, a tie)" if self.current_tok_s > self.best_tok_s else ""
        return f"{self.simulated()}: B* is kept{tie}"

    def as_dict(self) -> dict:
        return {
            "max_delay_ms": self.max_delay_ms,
            "horizon_ms": HORIZON_MS,
            "best": dict(zip(self.models, self.best, strict=True)),
            "best_tok_s": self.best_tok_s,
            "current": dict(zip(self.models, self.current, strict=True)),
            "current_tok_s": self.current_tok_s,
            "kept": "current" if self.keep_current else "best",
        }


def current_thresholds(plan: dict, models: tuple[str, ...]) -> tuple[int, ...]:
    """The plan's thresholds before tuning: a fixed `batch` as given, `auto` as 1."""
    return tuple(b if isinstance(b := plan["models"][m].get("batch"), int) else 1 for m in models)


def check_timeout(plan: dict, inputs: SystemInputs, best: tuple[int, ...]) -> TimeoutCheck | None:
    """B* and the plan's setting simulated with the plan's timeout; None where there is nothing to compare
    (the same thresholds, or a setting infeasible at this N)."""
    current = current_thresholds(plan, inputs.models)
    if current == tuple(best) or sum(b - 1 for b in current) >= inputs.concurrency:
        return None
    delay = float(plan.get("serve", {}).get("max_delay_ms", 5.0))
    served = {}
    for b in (tuple(best), current):
        cfg = SimConfig(thresholds=b, max_delay_ms=delay, horizon_ms=HORIZON_MS)
        if steps_error(inputs, cfg):
            return None
        served[b] = simulate(inputs, cfg).throughput
    return TimeoutCheck(inputs.models, tuple(best), current, served[tuple(best)], served[current], delay)
