"""From a plan (+ command-line values + a profile) to the throughput model's inputs (back into the plan:
`tuned_plan.py`).

Precedence, per model: step latency from `--step-ms`, else the profile; routing row from `--p`, else the
profile, else what the policy implies (`policy.py`). Committed tokens always come from the policy. A model's
latencies alone and its prefill cost come from the profile, where its step latencies do.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenrouter.compiler.plan import co_runners
from tokenrouter.throughput.colocation import calibrate
from tokenrouter.throughput.dtmc import analyze
from tokenrouter.throughput.inputs import (
    AloneLatency,
    ColocationTerm,
    PrefillCost,
    StepLatency,
    SystemInputs,
)
from tokenrouter.throughput.policy import policy_routing
from tokenrouter.throughput.profile_format import Profile


class ThroughputInputError(ValueError):
    """Missing or inconsistent inputs for the throughput model (the message says what to give)."""


class ThroughputUsageError(ThroughputInputError):
    """A malformed command-line value (`--p`, `--step-ms`, `--batch`)."""


def parse_step_ms(values: list[str] | None) -> dict[str, StepLatency]:
    """`MODEL=MS` (constant) or `MODEL=B:MS,B:MS,…` (by batch size)."""
    out: dict[str, StepLatency] = {}
    for item in values or []:
        name, sep, rest = item.partition("=")
        name = name.strip()
        if not sep or not name or not rest.strip():
            raise ThroughputUsageError(f"bad --step-ms '{item}': expected MODEL=MS or MODEL=B:MS,B:MS,…")
        try:
            if ":" in rest:
                pts = []
                for part in rest.split(","):
                    b, _, ms = part.partition(":")
                    pts.append((int(b), float(ms)))
                out[name] = StepLatency(tuple(pts))
            else:
                out[name] = StepLatency.constant(float(rest))
        except ValueError as e:
            raise ThroughputUsageError(f"bad --step-ms '{item}': {e}") from None
    return out


def parse_p(values: list[str] | None) -> dict[str, dict[str, float]]:
    """`FROM:TO=PROB` items, grouped by FROM."""
    out: dict[str, dict[str, float]] = {}
    for item in values or []:
        pair, sep, prob = item.partition("=")
        src, colon, dst = pair.partition(":")
        src, dst = src.strip(), dst.strip()
        if not sep or not colon or not src or not dst:
            raise ThroughputUsageError(f"bad --p '{item}': expected FROM:TO=PROB")
        try:
            v = float(prob)
        except ValueError:
            raise ThroughputUsageError(f"bad --p '{item}': {prob!r} is not a number") from None
        if not (0.0 <= v <= 1.0):
            raise ThroughputUsageError(f"bad --p '{item}': a probability must lie in [0, 1]")
        out.setdefault(src, {})[dst] = v
    return out


@dataclass(slots=True)
class PlanSystem:
    inputs: SystemInputs
    fixed: dict[str, int]
    auto: list[str]
    sources: dict[str, dict[str, str]] = field(default_factory=dict)  # {"p"|"step_ms": {model: source}}
    warnings: list[str] = field(default_factory=list)
    # the profile's ended requests, per model how many it wrote a token of, and the hops into it in the same
    # window (`workload.requests` and `counts`; empty without them): `concentration_warnings`
    requests: dict[str, Any] = field(default_factory=dict)
    # what the prefill costs are priced for: "512 tokens per request (--request-tokens)", or the profile's own load
    prefill_for: str = ""
    # the profile's measured delay of a hop into each model, ms (`workload.hop_ms`; empty where the profile has none,
    # None without a profile): `--hop-ms profile`
    hop_ms: dict[str, float] | None = None
    # the profile's host ms between each model's back-to-back steps (`workload.gap_ms`; as hop_ms): `--gap-ms profile`
    gap_ms: dict[str, float] | None = None

    def profiled(self) -> list[str]:
        """The models whose step latencies came from the profile (measured, not given)."""
        return [m for m, src in self.sources["step_ms"].items() if src == "profile"]


def auto_models(plan: dict) -> list[str]:
    """Models whose threshold is chosen by `tune`: `batch: auto`, or recorded as auto by an earlier tune."""
    earlier = set(plan.get("tuning", {}).get("auto", []))
    return [m for m, s in plan["models"].items() if s.get("batch") == "auto" or m in earlier]


def system_from_plan(
    plan: dict,
    concurrency: int | None = None,
    step_ms: dict[str, StepLatency] | None = None,
    p: dict[str, dict[str, float]] | None = None,
    profile: Profile | None = None,
    request_tokens: int | None = None,
) -> PlanSystem:
    """`request_tokens`: the tokens each request of the load to tune for commits, which prices the profile's
    prompt prefills per request (`with_prefill`); None: as the profile's own load had them."""
    models = tuple(plan["models"])
    step_ms, p = dict(step_ms or {}), dict(p or {})
    n = _check_given(plan, models, step_ms, p, concurrency, request_tokens)
    warnings = []
    if profile is not None:
        sha = plan.get("source", {}).get("sha256")
        if profile.source_sha256 and sha and profile.source_sha256 != sha:
            warnings.append("the profile was made for another version of the policy (source sha256 differs)")
    implied = policy_routing(plan)
    sources: dict[str, dict[str, str]] = {"step_ms": {}, "p": {}}
    steps = _step_latencies(models, step_ms, profile, sources["step_ms"])
    pm = _routing(models, p, profile, implied, sources["p"])
    cm = np.array([[implied.keep[a].get(b, 0.0) for b in models] for a in models])
    try:
        inputs = SystemInputs(models, tuple(steps), pm, cm, n, models.index(plan["entry"]))
        inputs, prefill_for = _measured_terms(inputs, plan, profile, request_tokens, sources, warnings)
    except ValueError as e:
        raise ThroughputInputError(str(e)) from None
    auto = auto_models(plan)
    fixed = {m: int(s["batch"]) for m, s in plan["models"].items() if m not in auto}
    return PlanSystem(
        inputs, fixed, auto, sources, warnings, _profile_requests(profile, sources["p"]), prefill_for,
        _profile_ms(profile, models, "hop_ms"), _profile_ms(profile, models, "gap_ms"),
    )  # fmt: skip


def _check_given(
    plan: dict, models: tuple[str, ...], step_ms: dict, p: dict, concurrency, request_tokens
) -> int:
    """The models named in `--step-ms` and `--p`, the concurrency N (returned: the plan's where none is given)
    and the request tokens."""
    for name in [*step_ms, *p, *(t for row in p.values() for t in row)]:
        if name not in models:
            raise ThroughputInputError(f"unknown model '{name}' (the plan's models: {', '.join(models)})")
    n = plan["serve"]["concurrency"] if concurrency is None else concurrency
    if not isinstance(n, int) or n < 1:
        raise ThroughputInputError(f"--concurrency must be an int >= 1, got {n!r}")
    if request_tokens is not None and (not isinstance(request_tokens, int) or request_tokens < 1):
        raise ThroughputUsageError(f"--request-tokens must be an int >= 1, got {request_tokens!r}")
    return n


def _step_latencies(
    models, step_ms: dict, profile: Profile | None, sources: dict[str, str]
) -> list[StepLatency]:
    """Each model's step latency, given (`--step-ms`) or from the profile; `sources` says which."""
    steps: list[StepLatency] = []
    missing = []
    for m in models:
        if m in step_ms:
            steps.append(step_ms[m])
            sources[m] = "--step-ms"
        elif profile is not None and m in profile.step_ms:
            steps.append(profile.step_ms[m])
            sources[m] = "profile"
        else:
            missing.append(m)
    if missing:
        raise ThroughputInputError(
            f"no step latency for {', '.join(missing)}: give --step-ms MODEL=MS (or MODEL=B:MS,B:MS,…) "
            "or --profile FILE"
        )
    return steps


def _routing(models, p: dict, profile: Profile | None, implied, sources: dict[str, str]) -> np.ndarray:
    """The routing matrix, each row given (`--p`), from the profile, or implied by the policy; `sources` says
    which."""
    pm = np.zeros((len(models), len(models)))
    missing = []
    for i, m in enumerate(models):
        if m in p:
            row, src = _given_row(m, p[m], implied), "--p"
        elif profile is not None and m in profile.routing:
            row, src = _profile_row(m, profile, models), "profile"
        elif m in implied.rows:
            row, src = implied.rows[m], "policy"
        else:
            missing.append(f"{m} ({implied.unknown.get(m, 'not implied')})")
            continue
        sources[m] = src
        for t, v in row.items():
            pm[i, models.index(t)] = v
    if missing:
        raise ThroughputInputError(
            "routing probabilities are not implied by the policy for "
            + "; ".join(missing)
            + ": give them with --p FROM:TO=PROB or --profile FILE"
        )
    return pm


def _profile_row(m: str, profile: Profile, models) -> dict[str, float]:
    """The profile's routing row of model m, whose targets must be models of the plan."""
    row = profile.routing[m]
    for t in row:
        if t not in models:
            raise ThroughputInputError(
                f"the profile routes {m} to unknown model '{t}' (models: {', '.join(models)})"
            )
    return row


def _given_row(m: str, given: dict[str, float], implied) -> dict[str, float]:
    """`--p`'s row from model m, its stay probability the rest where not given; refused where it does not sum
    to 1 or routes where the policy never does."""
    row = dict(given)
    off = sum(v for t, v in row.items() if t != m)
    if m in row:
        if not math.isclose(sum(row.values()), 1.0, abs_tol=1e-6):
            raise ThroughputInputError(
                f"--p from {m} sums to {sum(row.values()):.6g}; with {m}:{m} given the row must sum to 1"
            )
    elif off > 1.0 + 1e-9:
        raise ThroughputInputError(f"--p from {m} sums to {off:.6g} > 1")
    else:
        row[m] = max(0.0, 1.0 - off)
    for t, v in row.items():
        if t != m and v > 0 and t not in implied.keep[m]:
            raise ThroughputInputError(f"--p {m}:{t}: the policy never routes from {m} to {t}")
    return row


def _measured_terms(
    inputs: SystemInputs, plan: dict, profile: Profile | None, request_tokens, sources, warnings
):
    """The inputs with what the profile measured beside the step latencies: co-location terms, latencies
    alone, prompt prefill costs (`sources` and `warnings` say which were taken); and the load the prefills are
    priced for ("" without them)."""
    models, prefill_for = inputs.models, ""
    terms = _colocation_terms(models, profile, sources["step_ms"])
    if terms:
        inputs, sources["colocation"], dropped = calibrate(inputs, terms, profile, analyze)
        warnings.extend(dropped)
    if profile is not None and profile.alone_ms:
        inputs = by_state(inputs, profile, _alone_groups(plan, profile, sources["step_ms"], warnings))
        if inputs.alone:
            sources["alone"] = {m: "profile" for m, a in zip(models, inputs.alone, strict=True) if a}
    elif profile is not None and profile.workload.get("alone_too_few") and any(co_runners(plan).values()):
        warnings.append(_too_few_alone(profile))
    if profile is not None and profile.prefill:
        chosen = _prefill_models(profile, sources["step_ms"], warnings)
        inputs = with_prefill(inputs, profile, chosen, request_tokens, warnings)
        if inputs.prefill:
            sources["prefill"] = {m: "profile" for m, c in zip(models, inputs.prefill, strict=True) if c}
            prefill_for = _prefill_for(profile, request_tokens)
    return inputs, prefill_for


def _profile_ms(profile: Profile | None, models: tuple[str, ...], key: str) -> dict[str, float] | None:
    """The profile's `workload.KEY` for the plan's models (from serving metrics: `hop_ms`, the mean delay of a hop
    into each model; `gap_ms`, the mean host time between its back-to-back steps), ms; {} where the profile has
    none, None without a profile."""
    if profile is None:
        return None
    by = profile.workload.get(key) or {}
    ok = isinstance(by, dict) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        for v in by.values()
    )
    if not ok:
        raise ThroughputInputError(f"the profile's workload.{key} must map models to ms >= 0, got {by!r}")
    return {m: float(ms) for m, ms in by.items() if m in models}


def _prefill_for(profile: Profile, request_tokens: int | None) -> str:
    """What the prefill costs are priced for, in words (`tune` prints it)."""
    if request_tokens is not None and all(
        c.get("ms_per_request") is not None for c in profile.prefill.values()
    ):
        return f"{request_tokens} tokens per request (--request-tokens)"
    ended = (profile.workload.get("requests") or {}).get("ended") or 0
    generated = profile.workload.get("generated_tokens") or 0
    own = f", {generated / ended:.0f} tokens per request" if ended and generated else ""
    return f"the profile's own load{own} (--request-tokens prices another)"


def _profile_requests(profile: Profile | None, p_sources: dict[str, str]) -> dict[str, Any]:
    """The profile's ended requests, how many each model wrote a token of, and the hops into each model, where
    the routing comes from that profile (the same window); {} otherwise."""
    req = (profile.workload.get("requests") or {}) if profile is not None else {}
    if not isinstance(req, dict):
        raise ThroughputInputError(f"the profile's workload.requests is not an object: {req!r}")
    if not req.get("ended") or not req.get("visited") or not p_sources:
        return {}
    ended, visited = req["ended"], req["visited"]
    counts = [ended, *visited.values()] if isinstance(visited, dict) else [None]
    if not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in counts):
        raise ThroughputInputError(
            f"the profile's workload.requests needs an int `ended` and `visited` as model -> int, got {req!r}"
        )
    if any(src != "profile" for src in p_sources.values()):
        return {}
    hops_in: dict[str, int] = {}
    for x, row in profile.counts.items():
        for y, n in row.items():
            if y != x:
                hops_in[y] = hops_in.get(y, 0) + int(n)
    return {"ended": ended, "visited": dict(visited), "hops_in": hops_in}


def concentration_warnings(system: PlanSystem, thresholds: Sequence[int]) -> list[str]:
    """The thresholds B_i > 1 (by model, in the system's order) of models that the profile's routing reached in
    far fewer requests than alike requests would: with h hops into model i per request, about n·exp(−h) of n
    requests alike would never reach it (hops spread at random over requests), and the chain assumes alike
    requests. Where routing concentrates
    in a few (an untrained router on random weights: 13 of 16 requests sent the 8B nothing), the
    profile's share is a noisy sample, and a hop into i waits for rows that seldom come, up to max_delay_ms: on
    the H200 the tuned (1, 2) served 0.82x eager there; since a subserver steps at once when every request it
    holds is runnable, a hop waits only for requests that visited i before and are away (0.90-0.91x). Warned when at least 3
    requests, and more than twice the alike figure plus 2, never reached i."""
    req = system.requests
    if not req:
        return []
    n = req["ended"]
    out = []
    for i, m in enumerate(system.inputs.models):
        b = thresholds[i]
        if b <= 1 or i == system.inputs.entry or m not in req["visited"]:
            continue
        h = req["hops_in"].get(m, 0) / n
        missing, alike = n - int(req["visited"][m]), n * math.exp(-h)
        if missing >= 3 and missing > 2.0 * alike + 2.0:
            out.append(_concentration_line(m, b, n, h, missing, alike))
    return out


def _concentration_line(m: str, b: int, n: int, h: float, missing: int, alike: float) -> str:
    return (
        f"B_{m} = {b}: {missing} of the profile's {n} requests never reached {m}, where {n} requests alike, "
        f"with its {h:.1f} hops per request, would leave about {alike:.1f}: routing concentrates in a few "
        f"requests, which the chain does not model (it assumes alike requests), so the profile's share is "
        f"a noisy sample and a hop into {m} may wait up to max_delay_ms for requests that visited {m} before "
        f"and seldom come back; serve the plan at these thresholds against `--mode eager` (or B_{m} = 1) "
        f"before keeping them, or replay a benchmark's requests with `tokenrouter simulate --requests`"
    )


def _colocation_terms(
    models: tuple[str, ...], profile: Profile | None, step_sources: dict[str, str]
) -> tuple[ColocationTerm | None, ...]:
    """The profile's co-location terms for the models whose step latencies it gave (none otherwise)."""
    if profile is None or not profile.colocation:
        return ()
    terms: list[ColocationTerm | None] = []
    for m in models:
        term = profile.colocation.get(m)
        if term is None or step_sources.get(m) != "profile":
            terms.append(None)
            continue
        unknown = [x for x in term["co_runners"] if x not in models or x == m]
        if unknown:
            raise ThroughputInputError(
                f"the profile's co-location term of {m} names {unknown[0]!r}, not another model of the plan"
            )
        co = tuple(models.index(x) for x in term["co_runners"])
        terms.append(ColocationTerm(co, float(term["ms_per_share"]), float(term["at_share"])))
    return tuple(terms) if any(t is not None for t in terms) else ()


def _too_few_alone(profile: Profile) -> str:
    seen = ", ".join(f"{m} {n}" for m, n in profile.workload["alone_too_few"].items())
    need = profile.workload.get("min_steps", "min_steps")
    return (
        f"the profile's steps alone are too few for contention by state ({seen}; a model needs {need}): the "
        "chain prices every step at its mean beside the other model, which under-rates thresholds that leave the "
        "small model stepping alone; profile a longer load (more requests)"
    )


def _alone_groups(
    plan: dict, profile: Profile, step_sources: dict[str, str], warnings: list
) -> dict[str, list[str]]:
    """The co-runners (`models.*.gpus`) of each model whose latencies alone the profile gives and that `by_state`
    may use: the profile gave its step latencies too and another model shares its GPU; a warning for each one
    left out."""
    groups = co_runners(plan)
    out: dict[str, list[str]] = {}
    for m in (x for x in plan["models"] if x in profile.alone_ms):
        if step_sources.get(m) != "profile":
            warnings.append(
                f"the profile's latencies alone of {m} are left out: its step latencies come from --step-ms"
            )
        elif not groups.get(m):
            warnings.append(
                f"the profile's latencies alone of {m} are left out: no model shares its GPU in this plan"
            )
        else:
            out[m] = groups[m]
    return out


def _prefill_models(profile: Profile, step_sources: dict[str, str], warnings: list) -> list[str]:
    """The models whose prefill cost the profile gives and `with_prefill` may use (the profile gave their step
    latencies too: those leave its prefill steps out); a warning for each one left out."""
    out = []
    for m in profile.prefill:
        if step_sources.get(m) == "profile":
            out.append(m)
        elif m in step_sources:
            warnings.append(
                f"the profile's prefill cost of {m} is left out: its step latencies come from --step-ms"
            )
    return out


def with_prefill(
    inputs: SystemInputs,
    profile: Profile,
    models: Sequence[str],
    request_tokens: int | None = None,
    warnings: list | None = None,
) -> SystemInputs:
    """`inputs` with the profile's prefill cost (`PrefillCost`) for each of `models` that has one. A prefill
    is paid per request, so its cost per committed token depends on how many tokens a request commits: with
    `request_tokens`, `ms_per_token` is the profile's `ms_per_request` over `request_tokens` (the matrix profiles
    with 256-token requests and benchmarks 512-token ones: the profile's own `ms_per_token` would price prefills
    twice over). Where the profile has no cost per request (its server did not count the requests that ended),
    its own `ms_per_token` stays, with a line in `warnings`."""
    costs = []
    for m in inputs.models:
        cost = profile.prefill.get(m) if m in models else None
        if cost is None:
            costs.append(None)
            continue
        costs.append(
            PrefillCost(_prefill_per_token(m, cost, request_tokens, warnings), cost.get("ms_per_visit"))
        )
    return dataclasses.replace(inputs, prefill=tuple(costs)) if any(costs) else inputs


def _prefill_per_token(m: str, cost: dict, request_tokens: int | None, warnings: list | None) -> float:
    """A prefill cost per committed token: per request over `request_tokens` where both are known, else the
    profile's own (with a line in `warnings` where `request_tokens` could not be used)."""
    per_token = cost["ms_per_token"]
    if request_tokens is not None:
        if cost.get("ms_per_request") is not None:
            per_token = cost["ms_per_request"] / request_tokens
        elif warnings is not None:
            warnings.append(
                f"the profile's prefill cost of {m} stays per token of the profile's own load, not scaled to "
                f"{request_tokens} tokens per request: the profile does not count the requests that ended"
            )
    return per_token


def by_state(inputs: SystemInputs, profile: Profile, groups: Mapping[str, Sequence[str]]) -> SystemInputs:
    """`inputs` with contention by state for the models of `groups` (model -> the models sharing its GPU) that
    the profile has latencies alone for: each gets an `AloneLatency` from `alone_ms`, and its step latency
    becomes its `beside_ms` where the profile measured them (else `step_ms`, the latencies of every step)."""
    models = inputs.models
    alone = tuple(
        AloneLatency(tuple(models.index(x) for x in groups[m]), profile.alone_ms[m])
        if groups.get(m) and m in profile.alone_ms
        else None
        for m in models
    )
    if not any(alone):
        return inputs
    step = tuple(
        profile.beside_ms.get(m, s) if a is not None else s
        for m, s, a in zip(models, inputs.step, alone, strict=True)
    )
    return dataclasses.replace(inputs, step=step, alone=alone)
