"""Models that share a GPU slow each other down: a co-location term for the throughput model.

The DTMC takes each model's step latency as a function of its own batch size. On one GPU that is not the
whole story: on the H200 the 0.6B's step beside an 8B shortened from 2.36 to 1.88 ms as delayed batching
made the 8B busy 56 % of the time instead of 87 %, so thresholds that take
the large model fewer, fuller steps gained 7-10 % over eager while the plain chain ranked them at or below
B = 1. The term: model i's step takes

    L_i(b) + S_i × (Σ_{j ∈ C_i} U_j − A_i)

where C_i are the models placed on one of i's GPUs (`models.*.gpus`), U_j their utilization (share of time
in steps), A_i the co-runners' summed busy share while L_i(b) was measured, and S_i (ms per unit of busy
share) is fitted from two served profiles at different thresholds (`fit`): the change of i's step at the
batch sizes both saw, over the change of its co-runners' busy share. The tuner re-expresses the term in the
chain's own utilization (`calibrate`): a server's measured busy share runs well below the chain's (on the H200
the 8B was busy 0.68 of the time at B = (1, 1), 0.93 in the chain), and a slope fitted on one scale and applied
on the other over-predicted that server's B_llm = 8 by 1.46×. Since U_j depends on the latencies, the chain is solved for
a fixed point (`solve`): latencies from the utilizations, the chain from the latencies, damped, until the
utilizations settle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tokenrouter.compiler.passes.check_feasibility import feasibility_error
from tokenrouter.compiler.plan import co_runners
from tokenrouter.throughput.inputs import ColocationTerm, SystemInputs
from tokenrouter.throughput.profile_format import Profile
from tokenrouter.throughput.ticks import ChainError, step_ticks

MIN_SHARE_GAP = 0.05  # the co-runners' busy share must differ this much between the two profiles
_ROUNDS = 50
_TOLERANCE = 1e-3  # utilization


class ColocationError(ValueError):
    """Two profiles that cannot give a co-location term (the message says why and what to do)."""


def _busy(profile: Profile, which: str) -> dict[str, float]:
    share = profile.workload.get("busy_share")
    if not isinstance(share, dict) or not share:
        raise ColocationError(
            f"the {which} profile records no busy share (workload.busy_share): make both with `tokenrouter "
            "profile --from-metrics` from a server of this version"
        )
    return share


def fit(plan: dict, base: Profile, other: Profile) -> Profile:
    """`base` with a co-location term per model that shares a GPU, fitted against `other` (the same plan
    served at other thresholds). Routing pools both profiles' decisions where both have counts."""
    groups = co_runners(plan)
    if not any(groups.values()):
        raise ColocationError(
            "no two models of the plan share a GPU (models.*.gpus): there is nothing to fit"
        )
    terms, too_close = _fit_terms(groups, base, other)
    if not terms:
        raise ColocationError(
            f"the models beside each model were about as busy in both profiles ({'; '.join(too_close)}), so "
            "they cannot tell how a step depends on them; serve the second at a higher threshold of the large "
            "model (`serve --batch MODEL=3`)"
        )
    return _with_terms(base, other, terms, too_close)


def _with_terms(base: Profile, other: Profile, terms: dict[str, dict], too_close: list[str]) -> Profile:
    """`base` with the fitted terms and both profiles' routing pooled."""
    counts, routing = _pooled_routing(base, other)
    sources = [base.workload.get("source", ""), other.workload.get("source", "")]
    return dataclasses.replace(
        base,
        routing=routing,
        counts=counts,
        workload={
            **base.workload,
            "colocation_sources": sources,
            **({"colocation_unfitted": too_close} if too_close else {}),
        },
        colocation=terms,
        alone_ms={},  # the term replaces the contention by state (a profile has one or the other)
        beside_ms={},
    )


def _fit_terms(
    groups: dict[str, list[str]], base: Profile, other: Profile
) -> tuple[dict[str, dict], list[str]]:
    """Each model's term where the profiles tell it apart, and the lines of the models where they do not."""
    busy = _busy(base, "first"), _busy(other, "second")
    terms: dict[str, dict] = {}
    too_close: list[str] = []
    for model, co in groups.items():
        if not co:
            continue
        term = _fit_term(model, co, base, other, busy)
        if isinstance(term, str):
            too_close.append(term)  # no term: the two profiles cannot tell how its step depends on them
        else:
            terms[model] = term
    return terms, too_close


def _fit_term(model: str, co: list[str], base: Profile, other: Profile, busy) -> dict | str:
    """The model's term: its step change between the profiles (weighted by the steps behind each batch size
    both measured) over the change of its co-runners' busy share; where the shares are too close, the line
    that says so."""
    la, lb, common = _common_steps(model, base, other)
    share_a = sum(busy[0].get(j, 0.0) for j in co)
    share_b = sum(busy[1].get(j, 0.0) for j in co)
    if abs(share_b - share_a) < MIN_SHARE_GAP:
        return f"{model} ({'+'.join(co)} busy {share_a:.2f} and {share_b:.2f})"
    change = _step_change(model, base, other, la, lb, common)
    slope = change / (share_b - share_a)
    return {
        "co_runners": co,
        "ms_per_share": round(max(0.0, slope), 4),
        "at_share": round(share_a, 4),
        "fit": {
            "busy_share": [round(share_a, 4), round(share_b, 4)],
            "step_change_ms": round(change, 4),
            "batch_sizes": common,
            "slope_ms_per_share": round(slope, 4),
            "thresholds": [base.workload.get("thresholds"), other.workload.get("thresholds")],
        },
    }


def _step_change(model: str, base: Profile, other: Profile, la: dict, lb: dict, common: list[int]) -> float:
    """The model's step change from `base` to `other`, weighted by the steps behind each batch size."""
    steps_a, steps_b = base.workload.get("steps") or {}, other.workload.get("steps") or {}
    weight = {
        b: min(steps_a.get(model, {}).get(str(b), 1), steps_b.get(model, {}).get(str(b), 1)) for b in common
    }
    return sum(weight[b] * (lb[b] - la[b]) for b in common) / sum(weight.values())


def _common_steps(model: str, base: Profile, other: Profile) -> tuple[dict, dict, list[int]]:
    """The model's step latency by batch size in each profile, and the batch sizes both measured."""
    if model not in base.step_ms or model not in other.step_ms:
        raise ColocationError(f"model {model!r} has no step latencies in both profiles")
    la, lb = dict(base.step_ms[model].points), dict(other.step_ms[model].points)
    common = sorted(set(la) & set(lb))
    if not common:
        raise ColocationError(
            f"model {model!r}: no batch size ran often enough in both profiles (first: {sorted(la)}, "
            f"second: {sorted(lb)}); put more load on the servers"
        )
    return la, lb, common


def _pooled_routing(base: Profile, other: Profile) -> tuple[dict, dict]:
    """The decision counts and routing of both profiles pooled, where both have counts (else `base`'s)."""
    counts, routing = {}, {}
    for model, row in base.routing.items():
        a, b = base.counts.get(model), other.counts.get(model)
        if a and b:
            pooled = {t: a.get(t, 0) + b.get(t, 0) for t in {*a, *b}}
            total = sum(pooled.values())
            counts[model], routing[model] = pooled, {t: n / total for t, n in pooled.items()}
        else:
            counts[model], routing[model] = dict(a or {}), dict(row)
    return counts, routing


def calibrate(
    inputs: SystemInputs, terms: tuple[ColocationTerm | None, ...], profile: Profile, analyze: Callable
) -> tuple[SystemInputs, dict[str, str], list[str]]:
    """The inputs with the profile's terms in the chain's units, where each model's term came from, and a
    line for each term left out. Where the fit recorded both profiles' thresholds, the reference `at_share`
    is the co-runners' utilization in the plain chain at the first profile's thresholds, and the slope the
    measured step change over the change of that utilization at the second's: the chain then predicts the
    first profile's thresholds as the plain chain does, and moves the second's step by what was measured. A
    term whose co-runners the chain keeps about as busy at both is left out. With only the first profile's
    thresholds the slope stays on the measured scale; with none, the reference too."""
    plain = dataclasses.replace(inputs, colocation=())
    chains = _PlainChains(plain, analyze)
    out: list[ColocationTerm | None] = []
    sources: dict[str, str] = {}
    dropped: list[str] = []
    for m, t in zip(inputs.models, terms, strict=True):
        if t is None:
            out.append(None)
            continue
        term, note = _calibrated(m, t, profile, chains)
        out.append(term)
        if term is None:
            dropped.append(note)
        else:
            sources[m] = note
    if all(t is None for t in out):
        return plain, {}, dropped
    return dataclasses.replace(inputs, colocation=tuple(out)), sources, dropped


class _PlainChains:
    """The co-runners' utilization in the chain without terms, at the thresholds a profile was served at."""

    def __init__(self, plain: SystemInputs, analyze: Callable) -> None:
        self.plain, self.analyze, self.models = plain, analyze, plain.models
        self.chains: dict[tuple[int, ...], tuple[float, ...] | None] = {}

    def utilization(self, thresholds) -> tuple[float, ...] | None:
        """None where the thresholds are not one per model, infeasible, or the chain fails."""
        models = self.models
        if not isinstance(thresholds, dict) or set(thresholds) != set(models):
            return None
        if feasibility_error(thresholds, self.plain.concurrency):
            return None
        b = tuple(int(thresholds[m]) for m in models)
        if b not in self.chains:
            try:
                self.chains[b] = self.analyze(self.plain, b).utilization
            except ChainError:
                self.chains[b] = None
        return self.chains[b]

    def label(self, thresholds) -> str:
        return "(" + ", ".join(str(thresholds[m]) for m in self.models) + ")"


def _calibrated(m: str, t: ColocationTerm, profile: Profile, chains: _PlainChains):
    """Model m's term in the chain's units and where it came from; or None and the line that says why it is
    left out."""
    fitted = profile.colocation.get(m, {}).get("fit", {})
    served = fitted.get("thresholds") or []  # [first profile's, second's]; older fits: none
    first = served[0] if served else profile.workload.get("thresholds")
    second = served[1] if len(served) > 1 else None
    ua, ub = chains.utilization(first), chains.utilization(second)
    change = fitted.get("step_change_ms")
    if ua is None:
        return t, "profile (from the measured busy share)"
    at = sum(ua[j] for j in t.co_runners)
    if ub is None or not isinstance(change, (int, float)):
        note = f"profile (reference from the chain at B = {chains.label(first)}; slope from the busy share)"
        return dataclasses.replace(t, at_share=at), note
    to = sum(ub[j] for j in t.co_runners)
    co = "+".join(chains.models[j] for j in t.co_runners)
    if abs(to - at) < MIN_SHARE_GAP:
        return None, (
            f"the co-location term of {m} is left out: the chain keeps {co} as busy at B = {chains.label(first)} "
            f"({at:.2f}) as at {chains.label(second)} ({to:.2f}), so its step change ({change:+.3f} ms) cannot "
            "be put on the chain's scale"
        )
    term = ColocationTerm(t.co_runners, round(max(0.0, change / (to - at)), 4), at)
    return term, f"profile (from the chain at B = {chains.label(first)} and {chains.label(second)})"


def shifted(inputs: SystemInputs, shift: list[float], floor_ms: float) -> SystemInputs:
    """The inputs with each model's step latency moved by shift[i] ms (never below floor_ms), no term."""
    steps = tuple(s.shifted(d, floor_ms) for s, d in zip(inputs.step, shift, strict=True))
    return dataclasses.replace(inputs, step=steps, colocation=())


def solve(
    inputs: SystemInputs, thresholds: tuple[int, ...], plain: Callable, delta_ms: float, max_states: int
):
    """The chain at the fixed point of the co-location terms (`plain(inputs, thresholds, delta_ms,
    max_states)` solves one chain). The result carries the shifts it settled on."""
    terms, cache = inputs.colocation, {}

    def chain(shift: list[float]):
        moved = shifted(inputs, shift, delta_ms)
        key = tuple(map(tuple, step_ticks(moved, delta_ms)))  # the chain sees only the ticks
        if key not in cache:
            cache[key] = plain(moved, thresholds, delta_ms, max_states)
        return cache[key]

    shift = [0.0] * inputs.n_models
    res = chain(shift)
    u = list(res.utilization)
    for _ in range(_ROUNDS):
        shift = [
            0.0 if t is None else t.ms_per_share * (sum(u[j] for j in t.co_runners) - t.at_share)
            for t in terms
        ]
        res = chain(shift)
        step = max(abs(a - b) for a, b in zip(res.utilization, u, strict=True))
        u = [0.5 * a + 0.5 * b for a, b in zip(u, res.utilization, strict=True)]
        if step < _TOLERANCE:
            break
    return dataclasses.replace(res, step_shift_ms=tuple(round(d, 4) for d in shift))
