"""B* and the tuning record written into a copy of the plan (`apply_tuning`), and the warnings about a B* the
chain prices the less reliably."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

from tokenrouter.compiler.passes.check_feasibility import feasibility
from tokenrouter.throughput.inputs import SystemInputs
from tokenrouter.throughput.optimize import TuneResult
from tokenrouter.throughput.plan_inputs import PlanSystem
from tokenrouter.throughput.timeout_check import plan_delay_ms


def timeout_warnings(plan: dict, models: tuple[str, ...], best) -> list[str]:
    """The chosen thresholds that the plan's `max_delay_ms` timeout will cut short: at the rate the chain
    predicts requests reach model i (its rows per second), the B_i − 1 that follow the first one take longer
    than the timeout, so most of its batches start on the timeout with fewer rows than B_i. The chain has no
    timeout (`simulate` has), so its prediction for those thresholds is the less reliable."""
    delay = plan_delay_ms(plan)
    out = []
    for i, m in enumerate(models):
        b, rate = best.thresholds[i], best.steps_per_s[i] * best.mean_batch[i]  # requests per second
        if b > 1 and rate > 0 and (fill := 1000.0 * (b - 1) / rate) > delay:
            out.append(
                f"B_{m} = {b}: at the predicted {rate:.0f} tokens/s through {m}, it gathers {b} rows in about {fill:.0f} ms, "
                f"longer than max_delay_ms = {delay:g}, so the timeout will start most of its batches with fewer "
                f"rows (the chain does not model the timeout; `tokenrouter simulate` does); `serve {{ max_delay_ms: "
                f"{_round_up(2 * fill)} }}` would let them fill"
            )
    return out


def beyond_profile_warnings(inputs: SystemInputs, best) -> list[str]:
    """The chosen thresholds whose steps the step latencies do not reach: a latency is held at its largest
    batch size's beyond it (`StepLatency`), so where model i's threshold, or the chain's mean batch of its steps,
    is above that size, the chain prices those steps as if they had no more rows, and the prediction is the less
    reliable. On the H200 the eager profile at N = 16 had the 8B up to 10 rows;
    B_llm = 12 was priced at the 10-row 8.43 ms, served at 8.9-10.6 ms, and served 0.76x its prediction.
    A latency given as one constant is left alone."""
    out = []
    for i, m in enumerate(inputs.models):
        points = inputs.step[i].points
        top, ms = points[-1]
        b, mean = best.thresholds[i], best.mean_batch[i]
        if len(points) > 1 and max(b, mean) > top:
            out.append(
                f"B_{m} = {b}: {m}'s step latency was measured up to {top} rows, and the chain prices each step "
                f"of more rows at that size's {ms:.2f} ms; its steps here average {mean:.1f} rows, so the prediction "
                f"is the less reliable (a profile with more steps at those batch sizes would measure them)"
            )
    return out


def _round_up(ms: float) -> int:
    """A timeout to suggest: `ms` rounded up to 5 ms."""
    return 5 * math.ceil(ms / 5)


def apply_tuning(
    plan: dict,
    system: PlanSystem,
    result: TuneResult,
    top: int = 5,
    warnings: Sequence[str] = (),
    gap_ms: Sequence[float] | None = None,
) -> dict:
    """A copy of `plan` with B* for every auto model, the feasibility check redone for the tuned
    concurrency, and the inputs and result recorded under `tuning` (docs/ir.md); `warnings` about the
    result (`timeout_warnings`) are recorded after the inputs' own; `gap_ms`, per model, the host time the
    chain added to each step (`tune --gap-ms`)."""
    out = copy.deepcopy(plan)
    best = result.best_thresholds()
    for m in system.auto:
        out["models"][m]["batch"] = best[m]
    n = system.inputs.concurrency
    out["serve"]["concurrency"] = n
    out["checks"]["feasibility"] = feasibility(out["models"], n)
    out["tuning"] = _tuning_record(system, result, top, [*system.warnings, *warnings], gap_ms)
    return out


def _tuning_record(
    system: PlanSystem, result: TuneResult, top: int, warnings: list[str], gap_ms: Sequence[float] | None
) -> dict:
    """The plan's `tuning` section: the inputs, where they came from, the warnings and the result."""
    inp = system.inputs
    return {
        "auto": list(system.auto),
        "concurrency": inp.concurrency,
        **({"delta_ms": result.delta_ms} if result.delta_ms is not None else {}),
        **_recorded_inputs(inp),
        **({"gap_ms": dict(zip(inp.models, gap_ms, strict=True))} if gap_ms is not None else {}),
        "sources": system.sources,
        **({"warnings": warnings} if warnings else {}),
        "result": result.as_dict(top=top),
    }


def _recorded_inputs(inp: SystemInputs) -> dict[str, Any]:
    """The inputs as the plan's `tuning` records them: step latencies, routing and committed tokens, and the
    latencies alone, co-location terms and prefill costs where the inputs have them."""
    models = inp.models
    out: dict[str, Any] = {
        "step_ms": {m: [[b, ms] for b, ms in s.points] for m, s in zip(models, inp.step, strict=True)},
        "p": {
            a: {b: float(inp.p[i, j]) for j, b in enumerate(models) if inp.p[i, j] > 0}
            for i, a in enumerate(models)
        },  # fmt: skip
        "c": {
            a: {b: float(inp.c[i, j]) for j, b in enumerate(models) if inp.p[i, j] > 0}
            for i, a in enumerate(models)
        },  # fmt: skip
    }
    return out | _recorded_terms(inp)


def _recorded_terms(inp: SystemInputs) -> dict[str, Any]:
    """The latencies alone, co-location terms and prefill costs the inputs have."""
    models, out = inp.models, {}
    if inp.alone:
        out["alone"] = {
            m: {"co_runners": [models[j] for j in a.co_runners], "step_ms": [[b, ms] for b, ms in a.step.points]}
            for m, a in zip(models, inp.alone, strict=True)
            if a is not None
        }  # fmt: skip
    if inp.colocation:
        out["colocation"] = {
            m: {"co_runners": [models[j] for j in t.co_runners], "ms_per_share": t.ms_per_share,
                "at_share": t.at_share}
            for m, t in zip(models, inp.colocation, strict=True)
            if t is not None
        }  # fmt: skip
    if inp.prefill:
        out["prefill"] = {
            m: {"ms_per_token": c.ms_per_token, "ms_per_visit": c.ms_per_visit}
            for m, c in zip(models, inp.prefill, strict=True)
            if c is not None
        }
    return out
