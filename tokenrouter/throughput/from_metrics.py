"""A profile from a running deployment's `/metrics`: the step latencies the models really had next to each
other, and the hop rates they really took.

`tokenrouter profile` times each model alone. Models that share a GPU slow each other down (on the H200 the
0.6B step went from 2.0 to 3.4 ms beside a busy 8B), so a DTMC fed with the isolated
latencies over-predicts and can prefer thresholds that lose. Here the subservers' exact counters are read
instead: `tokenrouter_steps_by_batch_total` / `tokenrouter_step_seconds_by_batch_total` give L_i(b) for every
batch size that ran at least `min_steps` times, leaving out the steps the subserver counted as stalls
(`tokenrouter_slow_steps_by_batch_total`: over 50 ms and 10x their batch size's mean step per new token; on
the H200 one 1.1 s stall made a batch size's mean step 50 % longer; the profile's `workload.stalls` lists
them), and `tokenrouter_hops_total` over i's decisions gives p_ij.
A decision either writes a token (staying, or a hop that keeps it) or hops and drops it, so i's decisions
are `tokenrouter_generation_tokens_total` plus its dropping hops; which hops drop is read from the plan's
rules (`policy_routing`'s committed share per transition; a transition whose rules both keep and drop is
weighted by their probabilities where the policy implies them, else by the share of its rules that keep).
With a `before` scrape, only what happened in between counts (a warm-up, say, is left out). The profile's
`workload.busy_share` records each model's share of the window spent in steps
(`tokenrouter_step_seconds_total` over `tokenrouter_uptime_seconds_total`, both from the subserver's own
reports): how busy each model was at the latencies recorded, which matters where models share a GPU and slow
each other down (on the H200 the 0.6B's step shortens as the 8B beside it is busy less);
`workload.thresholds` the B_i the subservers ran with (`tokenrouter_batch_threshold`) and `workload.steps` the
steps behind each latency. Two such profiles at different thresholds give the co-location term
(`tokenrouter profile --colocation A B`, `colocation.py`). Where models share a GPU, the subservers also count
the steps that no step of the others overlapped (`tokenrouter_alone_steps_by_batch_total`,
`runtime/subserver/busy_board.py`): the profile then holds those steps' latencies as `alone_ms` and the
others' as `beside_ms` (both where `min_steps` ran, or `beside_ms` scaled where the alone steps are too few;
`step_ms` keeps every step; `alone_ms` is fitted non-decreasing in the batch size, `non_decreasing`), and the
throughput model
takes a step's latency by whether a co-runner is running when it starts. `workload.requests` holds the requests that ended in the window and, per model, how many of them it
wrote a token of (`tokenrouter_requests_visiting_total`): `tune` holds that against the hops into the model,
and warns where routing concentrates in a few requests (`plan_inputs.concentration_warnings`).

Prompt prefills are priced apart. The metrics say their layout's version (`tokenrouter_metrics_schema`; an
export without it is version 1). From version 2 the servers count the steps that ran some request's first tokens
on a model (`tokenrouter_first_steps_by_shape_total`, and the rows that were such first runs): those are the
prefills. A version 1 export is read by what it has: the first-run counters where it has them; else, where it
counts steps by shape only (`tokenrouter_steps_by_shape_total`), a step whose longest row ran more than
`prefill_above` new tokens is taken for one (64 by default: the largest extend the engine's CUDA graphs capture; that also takes a return after more
than 64 tokens away). A prefill step leaves its batch size's latency, alone or beside. What it took beyond a step
of its batch size becomes the profile's `prefill`: per model, those ms per token the system committed (the chain
spreads them over the model's steps), per request that ended (`tune --request-tokens` spreads them over a load's
requests) and per first run of a request there (the simulator adds them to a request's first step there;
`prefill.py`). With 3,072-token prompts four prefills made the 8B's latency at 4 rows 15.9 ms against 6.6 for its
other steps there.

Serve the plan with B = 1 (`--mode eager`) under the load to tune for, then `tokenrouter profile PLAN
--from-metrics URL [--since BEFORE.txt]` and `tokenrouter tune PLAN --profile ... -n N`.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from typing import Any

from tokenrouter.throughput.inputs import StepLatency
from tokenrouter.throughput.policy import policy_routing
from tokenrouter.throughput.profile_format import Profile

# new tokens in a step's longest row above which it is a prefill (the largest graphed extend)
PREFILL_ABOVE = 64
# counter -> (the prefill steps it feeds: those that ran a request's first tokens, or by their shape; 0: steps,
# 1: seconds, 2: first runs)
_PREFILL = {
    "tokenrouter_first_steps_by_shape_total": ("first", 0),
    "tokenrouter_first_step_seconds_by_shape_total": ("first", 1),
    "tokenrouter_first_step_rows_by_shape_total": ("first", 2),
    "tokenrouter_steps_by_shape_total": ("long", 0),
    "tokenrouter_step_seconds_by_shape_total": ("long", 1),
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# counter -> (the workload's mean it feeds, 0: its events / 1: their seconds)
_MEANS = {
    "tokenrouter_step_gaps_total": ("gap_ms", 0),
    "tokenrouter_step_gap_seconds_total": ("gap_ms", 1),
    "tokenrouter_hops_in_total": ("hop_ms", 0),
    "tokenrouter_hop_delay_seconds_total": ("hop_ms", 1),
}


# the newest layout of the metrics this reader knows (`tokenrouter_metrics_schema`); 1: exports without the gauge
METRICS_SCHEMA = 2


class MetricsProfileError(ValueError):
    """The metrics cannot make a profile; the message says what is missing."""


def metrics_schema(metrics: dict) -> int:
    """The layout version of a parsed export (`tokenrouter_metrics_schema`, 1 where it has none), refused where
    it is newer than this reader knows."""
    version = metrics.get(("tokenrouter_metrics_schema", ()), 1.0)
    if version != int(version) or not 1 <= version <= METRICS_SCHEMA:
        raise MetricsProfileError(
            f"the metrics are of layout version {version:g} (tokenrouter_metrics_schema), which this tokenrouter "
            f"does not read (versions 1 to {METRICS_SCHEMA}): read them with the tokenrouter of that server"
        )
    return int(version)


def _check_models(models: list[str], metrics: dict) -> None:
    """The models the metrics name (`model`, `from` and `to` labels of the tokenrouter_ series) must be the
    plan's: metrics of a server of another plan would make a profile of the wrong models' latencies and hops
    (a plan of the same model names that routes otherwise is `_check_routing`'s)."""
    seen = {
        value
        for name, labels in metrics
        if name.startswith("tokenrouter_")
        for key, value in labels
        if key in ("model", "from", "to")
    }
    extra, missing = sorted(seen - set(models)), [m for m in models if m not in seen]
    if extra or missing:
        why = "; ".join(
            ([f"they name {', '.join(map(repr, extra))}, not in the plan"] if extra else [])
            + ([f"they have nothing of the plan's {', '.join(map(repr, missing))}"] if missing else [])
        )
        raise MetricsProfileError(
            f"the metrics are not of this plan's models ({', '.join(models)}): {why}; were they read from a "
            "server of another plan?"
        )


def _check_routing(plan: dict, *metrics: dict) -> None:
    """Metrics of a server that publishes its plan (`tokenrouter_plan_info`) must
    be of a plan that routes as this one does (`routing_digest`): the same model names served by another policy
    (bernoulli at another `p`, r2r at another threshold) would make a profile of another routing's hops."""
    from tokenrouter.compiler.plan import routing_digest

    mine = routing_digest(plan)
    for scrape in metrics:
        for (name, labels), _ in scrape.items():
            lab = dict(labels)
            if name == "tokenrouter_plan_info" and lab.get("routing", mine) != mine:
                raise MetricsProfileError(
                    f"the metrics are of a server of policy {lab.get('policy', '?')!r}, which routes otherwise "
                    f"than this plan's {plan['policy']['name']!r} (routing digest {lab['routing'][:12]}, this "
                    f"plan's {mine[:12]}): were they read from a server of another plan?"
                )


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text → {(name, sorted labels): value}; comments and unparsable lines are skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        found = _SAMPLE.match(line)
        if not found:
            continue
        name, labels, value = found.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        out[(name, tuple(sorted(_LABEL.findall(labels or ""))))] = v
    return out


def profile_from_metrics(
    plan: dict,
    after: str,
    before: str | None = None,
    min_steps: int = 5,
    source: str = "",
    committed: dict[str, dict[str, float]] | None = None,
    fit_alone: bool = True,
    prefill_above: int | None = PREFILL_ABOVE,
) -> Profile:
    """The profile between two scrapes (`before` None: since the server started). `committed` (model ->
    {target: share of hops that keep their token}) defaults to what the plan's rules say. `fit_alone`: the
    latencies alone as the non-decreasing fit of their means (`non_decreasing`; `workload.alone_fit` says so),
    else the means as measured. `prefill_above` None leaves the prefill steps in their batch sizes' latencies;
    else they are priced apart (`prefill`): the steps that ran a request's first tokens where the server counts
    them, else those whose longest row ran more new tokens than `prefill_above`."""
    a, b = parse_metrics(after), parse_metrics(before or "")

    def delta(key) -> float:
        return a.get(key, 0.0) - b.get(key, 0.0)

    models = list(plan["models"])
    steps: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    tokens: dict[str, float] = {}
    busy: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # model -> [step seconds, uptime seconds]
    stalls: dict[str, dict[int, int]] = defaultdict(dict)  # model -> {batch size: stalled steps left out}
    alone: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    hops: dict[str, dict[str, float]] = defaultdict(dict)
    thresholds: dict[str, int] = {}
    visits: dict[str, int] = {}  # model -> ended requests it wrote a token of
    # model -> (batch size, overlap) -> [steps, seconds, first runs] of the prefill steps: those that ran a request's
    # first tokens (`first`, where the server counts them), or whose longest row ran > prefill_above (`long`)
    first: dict[str, dict[tuple[int, str], list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0] * 3))
    long: dict[str, dict[tuple[int, str], list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0] * 3))
    counts_first = metrics_schema(a) >= 2 or any(
        name == "tokenrouter_first_steps_by_shape_total" for name, _ in a
    )
    ended = 0.0
    # workload key -> model -> [events, seconds]: back-to-back steps and the host time between them; hops received
    # and their delay
    means: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for key in a:
        name, labels = key
        lab = dict(labels)
        if name in ("tokenrouter_steps_by_batch_total", "tokenrouter_step_seconds_by_batch_total"):
            steps[lab["model"]][int(lab["bs"])][name.startswith("tokenrouter_step_seconds")] += delta(key)
        elif name in (
            "tokenrouter_slow_steps_by_batch_total",
            "tokenrouter_slow_step_seconds_by_batch_total",
        ):
            n = delta(key)  # a stall's steps and seconds leave the batch size's totals
            steps[lab["model"]][int(lab["bs"])][name.startswith("tokenrouter_slow_step_seconds")] -= n
            if name == "tokenrouter_slow_steps_by_batch_total" and n > 0:
                stalls[lab["model"]][int(lab["bs"])] = int(round(n))
        elif name in (
            "tokenrouter_alone_steps_by_batch_total",
            "tokenrouter_alone_step_seconds_by_batch_total",
        ):
            alone[lab["model"]][int(lab["bs"])][name.startswith("tokenrouter_alone_step_seconds")] += delta(
                key
            )
        elif name in _PREFILL and prefill_above is not None and lab["overlap"] != "stall":
            # (a stall is left out of its batch size already, by the slow-step counters)
            table, i = _PREFILL[name]
            if table == "first" or int(lab["q"]) > prefill_above:
                (first if table == "first" else long)[lab["model"]][(int(lab["bs"]), lab["overlap"])][i] += (
                    delta(key)
                )
        elif name == "tokenrouter_generation_tokens_total":
            tokens[lab["model"]] = delta(key)
        elif name == "tokenrouter_hops_total":
            hops[lab["from"]][lab["to"]] = delta(key)
        elif name == "tokenrouter_requests_visiting_total":
            visits[lab["model"]] = int(round(delta(key)))
        elif name == "tokenrouter_e2e_request_latency_seconds_count":
            ended = delta(key)
        elif name in _MEANS:
            what, seconds = _MEANS[name]
            means[what][lab["model"]][seconds] = delta(key)
        elif name in ("tokenrouter_step_seconds_total", "tokenrouter_uptime_seconds_total"):
            busy[lab["model"]][name == "tokenrouter_uptime_seconds_total"] = delta(key)
        elif name == "tokenrouter_batch_threshold":
            thresholds[lab["model"]] = int(a[key])  # a gauge: as of the later scrape
    if not steps:
        raise MetricsProfileError(
            "no tokenrouter_steps_by_batch_total in the metrics: is this a tokenrouter server (0e29784 or later)?"
        )
    _check_models(models, a)
    _check_routing(plan, a, b)
    prefills = first if counts_first else long
    for x, by in prefills.items():  # the prefill steps leave their batch sizes' latencies, alone ones too
        for (bs, overlap), (n, sec, _) in by.items():
            for table in (steps, alone) if overlap == "alone" else (steps,):
                table[x][bs][0] -= n
                table[x][bs][1] -= sec
    step_ms: dict[str, StepLatency] = {}
    kept: dict[str, dict[str, int]] = {}  # model -> {batch size: steps behind its latency}
    for x in models:
        pts = [(bs, 1000.0 * sec / n) for bs, (n, sec) in sorted(steps.get(x, {}).items()) if n >= min_steps]
        kept[x] = {
            str(bs): int(round(n)) for bs, (n, _) in sorted(steps.get(x, {}).items()) if n >= min_steps
        }
        if not pts:
            seen = {bs: int(n) for bs, (n, _) in sorted(steps.get(x, {}).items())}
            raise MetricsProfileError(
                f"model {x!r}: no batch size ran {min_steps} times or more (steps by batch size: {seen or 'none'});"
                " put more load on the server before reading its metrics"
            )
        step_ms[x] = StepLatency(tuple(pts))
    alone_ms, beside_ms, by_state = _by_state(models, steps, alone, min_steps, fit_alone)
    prefill = _prefill_costs(
        models,
        prefills,
        step_ms,
        alone_ms,
        beside_ms,
        sum(tokens.values()),
        ended,
        None if counts_first else visits,
    )
    # the board counted steps alone, but too few for any model's latencies alone: `tune` warns (on the H200 the
    # 0.6B alone in 16 steps of a 4-round eager profile, and the plain chain chose a threshold 12 % slower)
    too_few: dict[str, int] = {}
    if not alone_ms:
        for x in models:
            if n := int(round(sum(c for c, _ in alone.get(x, {}).values()))):
                too_few[x] = n
    if committed is None:
        committed = policy_routing(plan).keep  # x -> {y: share of x -> y hops that keep their token}
    counts: dict[str, dict[str, int]] = {}
    routing: dict[str, dict[str, float]] = {}
    for x in models:
        row = {y: int(round(n)) for y, n in hops.get(x, {}).items() if y != x and n > 0}
        dropped = sum(n * (1.0 - committed.get(x, {}).get(y, 1.0)) for y, n in row.items())
        decisions = int(round(tokens.get(x, 0.0) + dropped))
        if decisions <= 0:
            continue
        row[x] = decisions - sum(row.values())
        if row[x] < 0:
            raise MetricsProfileError(
                f"model {x!r}: more hops than decisions (tokens written plus dropping hops): are the scrapes in "
                "order?"
            )
        counts[x] = row
        routing[x] = {y: n / decisions for y, n in row.items()}
    # a server that reports no uptime gives no busy share
    busy_share = {x: busy[x][0] / busy[x][1] for x in models if x in busy and busy[x][1] > 0}
    # host ms between back-to-back steps, and ms of delay per hop received, where the server counts them; neither
    # is in the chain yet
    mean_ms = {
        what: {x: 1000.0 * by[x][1] / by[x][0] for x in models if x in by and by[x][0] >= min_steps}
        for what, by in means.items()
    }
    return Profile(
        policy=plan["policy"]["name"],
        source_sha256=plan.get("source", {}).get("sha256"),
        step_ms=step_ms,
        routing=routing,
        counts=counts,
        device="serving metrics",
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        workload={
            "source": source or "metrics",
            "generated_tokens": int(sum(tokens.values())),
            "min_steps": min_steps,
            "steps": kept,
            **({"thresholds": {x: thresholds[x] for x in models if x in thresholds}} if thresholds else {}),
            **({"busy_share": busy_share} if busy_share else {}),
            **{what: ms for what, ms in sorted(mean_ms.items()) if ms},
            **({"stalls": {x: dict(sorted(v.items())) for x, v in stalls.items()}} if stalls else {}),
            **({"steps_by_state": by_state} if by_state else {}),
            **({"alone_fit": "non-decreasing"} if by_state and fit_alone else {}),
            **({"alone_too_few": too_few} if too_few else {}),
            # where the server counts them: the ended requests, and how many each model wrote in
            **({"requests": {"ended": int(round(ended)), "visited": visits}} if visits and ended > 0 else {}),
            **(
                {"prefill_steps": "first runs" if counts_first else f"longest row > {prefill_above}"}
                if prefill_above is not None
                else {}
            ),
        },  # fmt: skip
        alone_ms=alone_ms,
        beside_ms=beside_ms,
        prefill=prefill,
    )


def _prefill_costs(models, prefills, step_ms, alone_ms, beside_ms, committed: float, ended: float, visits):
    """Per model with prefill steps: {"steps", "ms": what they took beyond a step of their batch size (alone
    steps against the latency alone, overlapped ones against the latency beside, where the profile has them),
    "ms_per_token": that over the tokens the system committed, "ms_per_request": over the requests that ended
    (where the server counts them), "ms_per_visit": over the first runs of a request on the model (counted with
    the steps; on older servers, `visits`: the ended requests that the model wrote a token of)}."""
    out: dict[str, dict[str, float]] = {}
    for x in models:
        by = prefills.get(x) or {}
        n = sum(c for c, _, _ in by.values())
        if n < 0.5 or committed <= 0:
            continue
        extra = 0.0
        for (bs, overlap), (c, sec, _) in by.items():
            table = alone_ms if overlap == "alone" else beside_ms if overlap == "overlapped" else {}
            routine = table.get(x, step_ms[x]).at(bs)
            extra += max(0.0, 1000.0 * sec - c * routine)
        cost = {"steps": int(round(n)), "ms": round(extra, 3), "ms_per_token": extra / committed}
        if ended > 0:
            cost["ms_per_request"] = extra / ended
        runs = sum(r for _, _, r in by.values()) if visits is None else visits.get(x, 0)
        if runs > 0:
            cost["ms_per_visit"] = extra / runs
        out[x] = cost
    return out


def _by_state(models: list[str], steps: dict, alone: dict, min_steps: int, fit: bool = True):
    """`alone_ms` and `beside_ms` for the models with both kinds of steps at some batch size run `min_steps`
    times or more (stalls are in neither: the subserver counts no stall as alone), and the steps behind
    them. Alone steps are rare where the co-runner is seldom idle (an eager profile: the 0.6B runs alone only
    while the 8B holds no request), so when no batch size has `min_steps` of them but all of them together do,
    `alone_ms` is `beside_ms` scaled by the ratio those steps show (their time over what the same steps take
    beside), which keeps the shape of the latency over the batch size."""
    alone_ms: dict[str, StepLatency] = {}
    beside_ms: dict[str, StepLatency] = {}
    counts: dict[str, dict[str, Any]] = {}  # model -> steps alone and beside by batch size (and the ratio)
    for x in models:
        every = alone.get(x, {})
        lone = {bs: (n, sec) for bs, (n, sec) in every.items() if n >= min_steps}
        rest = {}  # every step less the alone ones
        for bs, (n, sec) in steps.get(x, {}).items():
            an, asec = every.get(bs, (0.0, 0.0))
            if n - an >= min_steps and sec - asec > 0:
                rest[bs] = (n - an, sec - asec)
        if not rest:
            continue
        beside = StepLatency(tuple((bs, 1000.0 * sec / n) for bs, (n, sec) in sorted(rest.items())))
        scaled = None  # the ratio that scales beside_ms into alone_ms, where alone steps are too few
        pooled: list[list[int]] = []
        if lone:
            means = [(bs, 1000.0 * sec / n, n) for bs, (n, sec) in sorted(lone.items())]
            fitted, pooled = non_decreasing(means) if fit else ([(bs, ms) for bs, ms, _ in means], [])
            alone_ms[x] = StepLatency(tuple(fitted))
        elif sum(n for n, _ in every.values()) >= min_steps:
            scaled = sum(1000.0 * sec for _, sec in every.values()) / sum(
                n * beside.at(bs) for bs, (n, _) in every.items()
            )
            alone_ms[x] = StepLatency(tuple((bs, ms * scaled) for bs, ms in beside.points))
            lone = {bs: v for bs, v in every.items() if v[0] > 0}
        else:
            continue
        beside_ms[x] = beside
        counts[x] = {
            "alone": {str(bs): int(round(n)) for bs, (n, _) in sorted(lone.items())},
            "beside": {str(bs): int(round(n)) for bs, (n, _) in sorted(rest.items())},
        }
        if scaled is not None:
            counts[x]["alone_scaled_by"] = scaled
        if pooled:
            counts[x]["alone_pooled"] = pooled
    return alone_ms, beside_ms, counts


def non_decreasing(points: list[tuple[int, float, float]]) -> tuple[list[tuple[int, float]], list[list[int]]]:
    """The weighted least-squares non-decreasing fit (pool adjacent violators) of (batch size, ms, steps) points,
    and the runs of batch sizes it pooled into one mean. A step that no other step overlapped costs the model
    alone, and with more rows it costs no less; where a batch size's mean says otherwise, its steps are a
    different mix: in one served H200 profile the 0.6B took 1.74 ms at 3 rows alone (56 steps) against 1.24 at 4
    (430), a state it rarely ran in there; the fixed (2, 6) row beside it ran it 1,028 times at 1.31 ms.
    Pooling weighs each mean by its steps."""
    blocks: list[list] = []  # [sum of ms x steps, steps, batch sizes]
    for bs, ms, n in points:
        blocks.append([ms * n, n, [bs]])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, n2, sizes = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += n2
            blocks[-1][2] += sizes
    fitted = [(bs, total / n) for total, n, sizes in blocks for bs in sizes]
    return fitted, [sizes for _, _, sizes in blocks if len(sizes) > 1]
