"""Serving modes: TokenRouter and the baselines it is measured against, on the same engine.

`tokenrouter serve PLAN --mode MODE` (docs/architecture.md, "Baselines"; docs/results.md):

| mode | what runs |
| --- | --- |
| `tokenrouter` | the plan as written: one subserver process per model, delayed batching, CUDA graphs. |
| `llm-only` | the large model alone (`--llm MODEL`, default the model with the most parameters): a one-model plan with no rules and B = 1; every request starts and stays there. |
| `eager` | TokenRouter with every threshold B_i = 1 (asynchronous loops, no delayed batching). |
| `no-graphs` | TokenRouter with CUDA graphs off in every engine (on CPU the same as `tokenrouter`). |
| `lockstep` | one process drives every model synchronously (`baselines/lockstep.py`): each step the entry model runs its whole batch, then the other models the rows routed to them. |
| `std-serving` | every hop is a new request to a prefix-caching server (`baselines/std_serving.py`, `prefix_cache.py`); B = 1. |

`serve --batch MODEL=B` replaces thresholds of the plan (modes `tokenrouter` and `no-graphs`), e.g. to
profile it at a second threshold for the throughput model's co-location term (docs/tuning.md).
`prepare(plan, mode, llm, batch)` turns the plan into what the launcher starts: a `ModeSetup` with the (possibly
rewritten) plan, engine overrides, and which process layout and scheduler to use.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

MODES = ("tokenrouter", "llm-only", "lockstep", "std-serving", "eager", "no-graphs")


class ModeError(ValueError):
    """A mode that cannot apply to this plan (the message is for users)."""


@dataclass(slots=True)
class ModeSetup:
    mode: str
    plan: dict
    engine_overrides: dict = field(default_factory=dict)  # passed to every model's load_engine
    lockstep: bool = False  # one process drives every model (baselines/lockstep.py) instead of one per model
    scheduler: str = "tokenrouter"  # the subservers' scheduler: "tokenrouter" or "std-serving"


def largest_model(plan: dict) -> str:
    """The model with the most parameters per its config.json (the first of equals in plan order)."""
    from tokenrouter.runtime.engine.config import load_model_config

    sizes = {}
    for name, spec in plan["models"].items():
        try:
            sizes[name] = load_model_config(spec["path"]).num_params()
        except Exception as e:  # a missing or malformed folder: say which, as the launcher would
            raise ModeError(f"model {name!r}: cannot read its config.json to size it: {e}") from None
    return max(sizes, key=lambda x: (sizes[x], -list(sizes).index(x)))


def with_thresholds(plan: dict, batch: int | Mapping[str, int] = 1) -> dict:
    """A copy of the plan with every model's delayed-batching threshold set to `batch` (an int for all, or a
    value per model), its feasibility checked again at the plan's concurrency."""
    from tokenrouter.compiler.passes.check_feasibility import feasibility

    out = copy.deepcopy(plan)
    out.pop("tuning", None)  # a tuning record describes thresholds this plan no longer has
    for name, spec in out["models"].items():
        spec["batch"] = batch[name] if isinstance(batch, Mapping) else batch
    out["checks"]["feasibility"] = feasibility(out["models"], out["serve"]["concurrency"])
    return out


def llm_only_plan(plan: dict, llm: str) -> dict:
    """A one-model plan: `llm` alone, entry, no routers, no rules, B = 1."""
    if llm not in plan["models"]:
        raise ModeError(f"--llm {llm!r} is not a model of the plan (models: {', '.join(plan['models'])})")
    out = copy.deepcopy(plan)
    out["models"] = {llm: out["models"][llm]}
    out["entry"] = llm
    out["routers"] = {}
    out["routes"] = {
        llm: {"model": llm, "features": [], "routers": [], "uses_uniform": False, "nodes": [], "rules": []}
    }
    out["checks"]["progress"] = {"ok": True}
    return with_thresholds(out, 1)


def override_thresholds(plan: dict, batch: Mapping[str, int]) -> dict:
    """`serve --batch MODEL=B`: the plan with those models' thresholds replaced (the others as written,
    `auto` read as 1), checked for deadlock at the plan's concurrency."""
    from tokenrouter.compiler.passes.check_feasibility import feasibility_error

    unknown = [m for m in batch if m not in plan["models"]]
    if unknown:
        raise ModeError(
            f"--batch {unknown[0]}: not a model of the plan (models: {', '.join(plan['models'])})"
        )
    bad = [f"{m}={b}" for m, b in batch.items() if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if bad:
        raise ModeError(f"--batch {bad[0]}: a threshold is an int >= 1")
    current = {m: s.get("batch", "auto") for m, s in plan["models"].items()}
    thresholds = {m: batch.get(m, 1 if b == "auto" else int(b)) for m, b in current.items()}
    error = feasibility_error(thresholds, plan["serve"]["concurrency"])
    if error:
        raise ModeError(f"--batch: {error}")
    return with_thresholds(plan, thresholds)


def prepare(
    plan: dict, mode: str, llm: str | None = None, batch: Mapping[str, int] | None = None
) -> ModeSetup:
    """What `serve --mode MODE [--batch MODEL=B]` starts for this plan. Raises ModeError for a mode that
    cannot apply."""
    if mode not in MODES:
        raise ModeError(f"unknown mode {mode!r} (expected one of {', '.join(MODES)})")
    if llm is not None and mode != "llm-only":
        raise ModeError("--llm applies to --mode llm-only only")
    if batch:
        if mode not in ("tokenrouter", "no-graphs"):
            raise ModeError(
                f"--batch applies to --mode tokenrouter and no-graphs (--mode {mode} fixes B = 1)"
            )
        plan = override_thresholds(plan, batch)
    setup = _setup(plan, mode, llm)
    from tokenrouter.compiler.plan import PlanError, validate_plan

    try:
        validate_plan(setup.plan, f"<plan for --mode {mode}>")
    except PlanError as e:  # a bug here, but say it plainly rather than fail later in a subserver
        raise ModeError(str(e)) from None
    return setup


def _setup(plan: dict, mode: str, llm: str | None) -> ModeSetup:
    """The mode's plan and settings, not yet validated."""
    if mode == "tokenrouter":
        return ModeSetup(mode, plan)
    if mode == "llm-only":
        return ModeSetup(mode, llm_only_plan(plan, llm or largest_model(plan)))
    if mode == "eager":
        return ModeSetup(mode, with_thresholds(plan, 1))
    if mode == "no-graphs":
        return ModeSetup(mode, plan, engine_overrides={"cuda_graph": False})
    if mode == "lockstep":
        return ModeSetup(mode, with_thresholds(plan, 1), lockstep=True)
    # std-serving
    bad = [x for x, s in plan["models"].items() if s.get("engine", "embedded") != "embedded"]
    if bad:
        raise ModeError(f"--mode std-serving needs the embedded engine; model {bad[0]!r} uses another")
    return ModeSetup(mode, with_thresholds(plan, 1), scheduler="std-serving")
