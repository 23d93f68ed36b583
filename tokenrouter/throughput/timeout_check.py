"""`tune`'s check of a B* that the plan's `max_delay_ms` timeout will cut short (`timeout_warnings`).

The chain has no timeout, so it cannot say how such a B* serves: most of a model's batches may start on the
timeout with fewer rows, and the plan serve worse than before it was tuned. The simulator has the timeout:
B* and the plan's current thresholds are both simulated with it (the same inputs, a closed loop of N
requests of the load's length, `sim_request_tokens`, `HORIZON_MS` of simulated time), and the better is kept,
B* where they are within `TIE` of each other. `tune` says which, and why. With `tune --tune-delay` the timeout
is chosen too (`search_timeouts`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tokenrouter.throughput.inputs import SystemInputs
from tokenrouter.throughput.sim_config import SimConfig, steps_error
from tokenrouter.throughput.simulate import simulate

HORIZON_MS = 20_000.0
TIE = 0.01  # a relative difference of simulated throughput taken as noise


def _named(models: tuple[str, ...], b: tuple[int, ...]) -> str:
    """Thresholds for a message: (slm 1, llm 3)."""
    return "(" + ", ".join(f"{m} {x}" for m, x in zip(models, b, strict=True)) + ")"


def plan_delay_ms(plan: dict) -> float:
    """The plan's batching timeout, `serve.max_delay_ms` (5 ms where it gives none, as the server has it)."""
    return float(plan.get("serve", {}).get("max_delay_ms", 5.0))


def _simulated(inputs: SystemInputs, b: tuple[int, ...], delay_ms: float, tokens: int | None) -> float | None:
    """Thresholds `b` simulated with the timeout `delay_ms` (a closed loop of N requests of `tokens` tokens each,
    `HORIZON_MS`): the tok/s, or None where the simulator cannot run them (`steps_error`)."""
    cfg = SimConfig(thresholds=tuple(b), max_delay_ms=delay_ms, horizon_ms=HORIZON_MS, request_tokens=tokens)
    return None if steps_error(inputs, cfg) else simulate(inputs, cfg).throughput


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
        name = functools.partial(_named, self.models)

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


def check_timeout(
    plan: dict, inputs: SystemInputs, best: tuple[int, ...], request_tokens: int | None = None
) -> TimeoutCheck | None:
    """B* and the plan's setting simulated with the plan's timeout, requests committing
    `sim_request_tokens(inputs, request_tokens)` tokens each; None where there is nothing to compare (the same
    thresholds, or a setting infeasible at this N)."""
    current = current_thresholds(plan, inputs.models)
    if current == tuple(best) or sum(b - 1 for b in current) >= inputs.concurrency:
        return None
    delay, tokens = plan_delay_ms(plan), sim_request_tokens(inputs, request_tokens)
    served = [_simulated(inputs, b, delay, tokens) for b in (tuple(best), current)]
    if None in served:
        return None
    return TimeoutCheck(inputs.models, tuple(best), current, served[0], served[1], delay)


# `search_timeouts`: multiples of the plan's timeout (of 2.5 ms where it is 0)
DELAY_LADDER = (1, 2, 4, 8, 16)
MAX_SEARCH_DELAY_MS = 200.0  # ... capped here
SEARCH_CANDIDATES = 4  # the chain's best thresholds simulated, beside the plan's own setting


@dataclass(frozen=True, slots=True)
class TimeoutSearch:
    """`tune --tune-delay`: thresholds simulated at timeouts from the plan's up (`search_timeouts`), and the
    pair chosen."""

    models: tuple[str, ...]
    plan_delay_ms: float
    served: dict[tuple[tuple[int, ...], float], float]  # (thresholds, max_delay_ms) -> simulated tok/s
    best: tuple[int, ...]
    delay_ms: float

    @property
    def best_tok_s(self) -> float:
        return self.served[(self.best, self.delay_ms)]

    def line(self) -> str:
        """What the search found, for `tune`'s output."""
        name = functools.partial(_named, self.models)

        at_plan = max(((t, b) for (b, d), t in self.served.items() if d == self.plan_delay_ms), default=None)
        delays = sorted({d for _, d in self.served})
        line = (f"timeout search: {len({b for b, _ in self.served})} settings simulated at max_delay_ms = "
                f"{', '.join(f'{d:g}' for d in delays)}: B = {name(self.best)} with max_delay_ms = {self.delay_ms:g} "
                f"serves {self.best_tok_s:.1f} tok/s")  # fmt: skip
        if at_plan is not None and (at_plan[1], self.plan_delay_ms) != (self.best, self.delay_ms):
            line += (
                f" (the best at the plan's {self.plan_delay_ms:g} ms: {name(at_plan[1])}, {at_plan[0]:.1f})"
            )
        return line

    def as_dict(self) -> dict:
        return {
            "plan_max_delay_ms": self.plan_delay_ms,
            "horizon_ms": HORIZON_MS,
            "max_delay_ms": self.delay_ms,
            "best": dict(zip(self.models, self.best, strict=True)),
            "best_tok_s": self.best_tok_s,
            "simulated": [
                {"thresholds": dict(zip(self.models, b, strict=True)), "max_delay_ms": d, "tok_s": t}
                for (b, d), t in self.served.items()
            ],
        }


def search_delays(plan_delay_ms: float) -> list[float]:
    """The timeouts `search_timeouts` tries: the plan's and `DELAY_LADDER` multiples of it, up to the cap."""
    base = plan_delay_ms if plan_delay_ms > 0 else 2.5
    return sorted({plan_delay_ms, *(min(base * k, MAX_SEARCH_DELAY_MS) for k in DELAY_LADDER)})


def sim_request_tokens(inputs: SystemInputs, given: int | None) -> int | None:
    """Tokens per request for `search_timeouts`' simulations: `given` (`--request-tokens`), else, where the entry
    model's prompt prefill is priced both per committed token and per first visit (which every request makes),
    their ratio: the load's own tokens per request, as the chain's per-token price has it. Else None: requests
    never end, and the simulator prices no prefill after its warm-up (a chain with prefill costs then reads
    lower than the simulations)."""
    if given is not None:
        return given
    cost = inputs.prefill_at(inputs.entry)
    if cost is None or not cost.ms_per_visit or not cost.ms_per_token:
        return None
    return max(1, round(cost.ms_per_visit / cost.ms_per_token))


def search_timeouts(
    plan: dict, inputs: SystemInputs, candidates: list[tuple[int, ...]], request_tokens: int | None = None
) -> TimeoutSearch:
    """Each of `candidates` (thresholds, in the chain's order, the chain's B* first) simulated with each of
    `search_delays`' timeouts (a closed loop of N requests, `HORIZON_MS`). The pair chosen: going from the
    shortest timeout to the longest, and at each timeout in the candidates' order, a pair replaces the one held
    only where it serves more than `TIE` more, so a longer timeout, or other thresholds than B*, must earn
    their place. A candidate the simulator cannot run (`steps_error`) is left out. Requests commit
    `sim_request_tokens(inputs, request_tokens)` tokens each."""
    plan_delay, tokens = plan_delay_ms(plan), sim_request_tokens(inputs, request_tokens)
    served: dict[tuple[tuple[int, ...], float], float] = {}
    for delay in search_delays(plan_delay):
        for b in candidates:
            if (tok_s := _simulated(inputs, b, delay, tokens)) is not None:
                served[(tuple(b), delay)] = tok_s
    if not served:
        raise ValueError("no candidate could be simulated")
    held = next(iter(served))
    for pair, tok_s in served.items():  # in order: timeouts ascending, then the candidates' order
        if tok_s > served[held] * (1.0 + TIE):
            held = pair
    return TimeoutSearch(inputs.models, plan_delay, served, held[0], held[1])
