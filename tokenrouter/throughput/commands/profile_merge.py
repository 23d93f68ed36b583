"""`profile --from-metrics` with `--alone` or `--merge`: a served profile completed by the latencies of
another."""

from __future__ import annotations

import dataclasses

from tokenrouter.throughput.commands.common import load_plan
from tokenrouter.throughput.inputs import StepLatency
from tokenrouter.throughput.plan_inputs import ThroughputInputError
from tokenrouter.throughput.profile_format import ProfileError, read_profile


def with_alone(plan_path: str, served, path: str):
    """`served` with latencies alone from the profile at `path` (`lend_alone`)."""
    try:
        lone = read_profile(path)
    except ProfileError as e:
        raise ThroughputInputError(str(e)) from None
    return lend_alone(load_plan(plan_path), served, lone, str(path))


def lend_alone(plan: dict, served, lone, source: str):
    """`served` with latencies alone from the profile `lone` (read from `source`), for the models that share a
    GPU with another model of the plan: `lone`'s own latencies alone where it has them (a profile served at
    other thresholds, whose busy board saw the model alone at more batch sizes than an eager one does),
    else its step latencies (a profile that timed each model alone). The served
    profile keeps its latencies beside the others."""
    from tokenrouter.compiler.plan import co_runners

    groups = co_runners(plan)
    shared = [m for m in served.step_ms if groups.get(m)]
    if not shared:
        raise ThroughputInputError(
            f"--alone {source}: no two models of the plan share a GPU (models.*.gpus): nothing runs beside another"
        )
    missing = [m for m in shared if m not in lone.step_ms]  # (a profile's alone_ms are among its step_ms)
    if missing:
        raise ThroughputInputError(f"--alone {source}: no step latencies for {', '.join(missing)}")
    measured = [m for m in shared if m in lone.alone_ms]
    return dataclasses.replace(
        served,
        alone_ms={m: lone.alone_ms[m] if m in measured else lone.step_ms[m] for m in shared},
        workload={**served.workload, "alone_source": source, "alone_measured": measured},
    )


def merged(base, path: str):
    """`base` with the latencies of the profile at `path` where it has them (`merge_served`)."""
    try:
        other = read_profile(path)
    except ProfileError as e:
        raise ThroughputInputError(str(e)) from None
    return merge_served(base, other, str(path))


def merge_served(base, other, source: str):
    """`base` (an eager profile) with `other`'s latencies, every step's, alone and beside, at each batch size
    `other` measured them, and `base`'s at the rest; `base`'s routing. `other` is the plan served at the
    thresholds delayed batching would use (say (2, 5)): there the models run at the batch sizes and beside each
    other as the tuned plan will, which eager does not show (its small model runs alone only at 1-3 rows, its
    large one beside the small one at nearly every step). Re-tuned offline from 16 served H200 runs, this chose
    (2, 6), the best threshold served, in 11, where the latencies alone lent by `lend_alone` chose the edge
    (3, 6) in 13."""
    models = [m for m in base.step_ms if m in other.step_ms]
    if not models:
        raise ThroughputInputError(
            f"--merge {source}: no step latencies for {', '.join(base.step_ms)} (the models of this profile)"
        )
    alone_ms, seams = _overlay(base.step_ms, base.alone_ms, other.alone_ms), {}
    if base.workload.get("alone_fit") == "non-decreasing":
        alone_ms, seams = _refit_alone(alone_ms, base, other)
    return dataclasses.replace(
        base,
        step_ms=_overlay(base.step_ms, base.step_ms, other.step_ms),
        alone_ms=alone_ms,
        beside_ms=_overlay(base.step_ms, base.beside_ms, other.beside_ms),
        workload=_merged_workload(base, other, source, models, bool(alone_ms), seams),
    )


def _merged_workload(base, other, source: str, models: list[str], has_alone: bool, seams: dict) -> dict:
    """`base`'s workload record with the merge's source, the batch sizes taken from `other`, and the seams."""
    return {
        **{k: v for k, v in base.workload.items() if not (k == "alone_too_few" and has_alone)},
        "merged_from": source,
        "merged_batches": {m: sorted(b for b, _ in other.step_ms[m].points) for m in models},
        **({"merged_alone_pooled": seams} if seams else {}),
    }


def _overlay(models, mine: dict, theirs: dict) -> dict:
    """`mine` with `theirs`' points at its batch sizes, for `models` only."""
    out = {}
    for m in models:
        points = dict(mine[m].points) if m in mine else {}
        points.update(theirs[m].points if m in theirs else ())
        if points:
            out[m] = StepLatency(tuple(points.items()))
    return out


def _refit_alone(alone_ms: dict, base, other) -> tuple[dict, dict[str, list[list[int]]]]:
    """Merged latencies alone fitted non-decreasing again (`from_metrics.non_decreasing`), each batch size's mean
    weighted by the steps behind it in the profile it came from (`workload.steps_by_state.MODEL.alone`; 1 where
    a profile has no count): each profile was fitted on its own, and where one profile's batch sizes meet the
    other's the joined curve can fall. Returns the latencies and, per model, the batch sizes pooled."""
    from tokenrouter.throughput.from_metrics import non_decreasing

    out, seams = dict(alone_ms), {}
    for m, latency in alone_ms.items():
        theirs = dict(other.alone_ms[m].points) if m in other.alone_ms else {}
        counts = {
            **_alone_steps(base, m),
            **{bs: n for bs, n in _alone_steps(other, m).items() if bs in theirs},
        }
        fitted, pooled = non_decreasing([(bs, ms, counts.get(bs) or 1.0) for bs, ms in latency.points])
        if pooled:
            out[m], seams[m] = StepLatency(tuple(fitted)), pooled
    return out, seams


def _alone_steps(profile, model: str) -> dict[int, float]:
    """The profile's count of steps alone at each batch size of the model."""
    alone = ((profile.workload.get("steps_by_state") or {}).get(model) or {}).get("alone") or {}
    return {int(bs): float(n) for bs, n in alone.items()}
