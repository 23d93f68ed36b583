"""A profile from a running deployment's counters: the step latencies the models really had next to each
other, and the hop rates they really took.

The counters come from the server's JSON stats document (`GET /v1/stats`, versioned by its `schema_version`;
`stats_format.py`), or from the Prometheus text of servers older than it (`GET /metrics`, or a copy saved from one;
`prometheus_format.py`); both are read into `Counters` (`read_counters`). The series named below are the
Prometheus names; the stats document carries the same counters per subserver (`subserver_stats`).

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

Prompt prefills are priced apart. The stats document, and Prometheus text of layout version 2
(`tokenrouter_metrics_schema`), count the steps that ran some request's first tokens on a model
(`tokenrouter_first_steps_by_shape_total`, and the rows that were such first runs): those are the prefills. A
version 1 export (without the gauge) is read by what it has: the first-run counters where it has them; else, where it
counts steps by shape only (`tokenrouter_steps_by_shape_total`), a step whose longest row ran more than
`prefill_above` new tokens is taken for one (64 by default: the largest extend the engine's CUDA graphs capture; that also takes a return after more
than 64 tokens away). A prefill step leaves its batch size's latency, alone or beside. What it took beyond a step
of its batch size becomes the profile's `prefill`: per model, those ms per token the system committed (the chain
spreads them over the model's steps), per request that ended (`tune --request-tokens` spreads them over a load's
requests) and per first run of a request there (the simulator adds them to a request's first step there;
`prefill.py`). With 3,072-token prompts four prefills made the 8B's latency at 4 rows 15.9 ms against 6.6 for its
other steps there.

Serve the plan with B = 1 (`--mode eager`) under the load to tune for, then `tokenrouter profile PLAN
--from-metrics URL [--since BEFORE]` (BEFORE: an earlier read, e.g. a saved `GET /v1/stats`) and
`tokenrouter tune PLAN --profile ... -n N`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from tokenrouter.throughput.inputs import StepLatency
from tokenrouter.throughput.policy import policy_routing
from tokenrouter.throughput.profile_format import Profile
from tokenrouter.throughput.prometheus_format import counters_from_prometheus
from tokenrouter.throughput.stats_format import Counters, MetricsProfileError, read_stats_document

__all__ = ["PREFILL_ABOVE", "MetricsProfileError", "non_decreasing", "profile_from_metrics", "read_counters",
           "read_source"]  # fmt: skip

# new tokens in a step's longest row above which it is a prefill (the largest graphed extend)
PREFILL_ABOVE = 64

Tables = dict[str, dict[int, list[float]]]  # model -> batch size -> [steps, seconds]
Prefills = dict[
    str, dict[tuple[int, str], list[float]]
]  # model -> (batch size, overlap) -> [steps, s, first runs]


def read_source(where: str) -> str:
    """A server's stats: at a URL its JSON stats document (`GET URL/v1/stats`, with the API key in
    TOKENROUTER_API_KEY where the server asks for one; a URL that ends in /metrics: its Prometheus text), else
    the file at `where` (a saved stats document or Prometheus text)."""
    import urllib.error
    import urllib.request

    if not where.startswith(("http://", "https://")):
        try:
            with open(where, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise MetricsProfileError(f"cannot read metrics file {where}: {e}") from None
    base = where.rstrip("/")
    url = base if base.endswith(("/metrics", "/v1/stats")) else base + "/v1/stats"
    key = os.environ.get("TOKENROUTER_API_KEY")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        hint = " (set TOKENROUTER_API_KEY to the server's key)" if e.code == 401 else ""
        raise MetricsProfileError(f"cannot read {url}: HTTP {e.code}{hint}") from None
    except (urllib.error.URLError, OSError) as e:
        raise MetricsProfileError(f"cannot read {url}: {getattr(e, 'reason', e)}") from None


def read_counters(source: str | dict) -> Counters:
    """The counters of a stats document (as parsed JSON, or its text), or of a server's Prometheus text."""
    if isinstance(source, dict):
        return read_stats_document(source)
    if source.lstrip().startswith("{"):
        try:
            doc = json.loads(source)
        except json.JSONDecodeError as e:
            raise MetricsProfileError(f"not a JSON stats document: {e}") from None
        return read_counters(doc)
    return counters_from_prometheus(source)


def _check_models(models: list[str], named: set[str]) -> None:
    """The models the metrics name (the `model`, `from` and `to` of their series) must be the plan's: metrics of a
    server of another plan would make a profile of the wrong models' latencies and hops (a plan of the same model
    names that routes otherwise is `_check_routing`'s)."""
    extra, missing = sorted(named - set(models)), [m for m in models if m not in named]
    if extra or missing:
        why = "; ".join(
            ([f"they name {', '.join(map(repr, extra))}, not in the plan"] if extra else [])
            + ([f"they have nothing of the plan's {', '.join(map(repr, missing))}"] if missing else [])
        )
        raise MetricsProfileError(
            f"the metrics are not of this plan's models ({', '.join(models)}): {why}; were they read from a "
            "server of another plan?"
        )


def _check_routing(plan: dict, *scrapes: Counters | None) -> None:
    """Metrics of a server that publishes its plan (`tokenrouter_plan_info`, the stats document's `plan`) must be
    of a plan that routes as this one does (`routing_digest`): the same model names served by another policy
    (bernoulli at another `p`, r2r at another threshold) would make a profile of another routing's hops."""
    from tokenrouter.compiler.plan import routing_digest

    mine = routing_digest(plan)
    for scrape in scrapes:
        theirs = (scrape.plan if scrape is not None else {}).get("routing", mine)
        if theirs != mine:
            raise MetricsProfileError(
                f"the metrics are of a server of policy {scrape.plan.get('policy', '?')!r}, which routes otherwise "
                f"than this plan's {plan['policy']['name']!r} (routing digest {theirs[:12]}, this "
                f"plan's {mine[:12]}): were they read from a server of another plan?"
            )


def profile_from_metrics(
    plan: dict,
    after: str | dict,
    before: str | dict | None = None,
    min_steps: int = 5,
    source: str = "",
    committed: dict[str, dict[str, float]] | None = None,
    fit_alone: bool = True,
    prefill_above: int | None = PREFILL_ABOVE,
) -> Profile:
    """The profile between two reads of a server's counters (`before` None: since the server started), each a
    stats document (`GET /v1/stats`, parsed or as text) or Prometheus text (`read_counters`). `committed` (model
    -> {target: share of hops that keep their token}) defaults to what the plan's rules say. `fit_alone`: the
    latencies alone as the non-decreasing fit of their means (`non_decreasing`; `workload.alone_fit` says so),
    else the means as measured. `prefill_above` None leaves the prefill steps in their batch sizes' latencies;
    else they are priced apart (`prefill`): the steps that ran a request's first tokens where the server counts
    them, else those whose longest row ran more new tokens than `prefill_above`."""
    now = read_counters(after)
    then = read_counters(before) if before else None
    if not any(c.by_bs or c.slow_by_bs for c in now.models.values()):
        raise MetricsProfileError(
            "no tokenrouter_steps_by_batch_total in the metrics (no steps by batch size): is this a tokenrouter "
            "server?"
        )
    _check_models(list(plan["models"]), now.named)
    _check_routing(plan, now, then)
    return _profile(plan, now.minus(then), min_steps, source, committed, fit_alone, prefill_above)


def _profile(plan, win: Counters, min_steps, source, committed, fit_alone, prefill_above) -> Profile:
    """The profile of the counters of a window (`profile_from_metrics`)."""
    models = list(plan["models"])
    steps, stalls = _steps_less_stalls(win)
    alone = {x: {bs: list(v[:2]) for bs, v in c.alone_by_bs.items()} for x, c in win.models.items()}
    prefills = _prefill_steps(win, prefill_above)
    _leave_out_prefills(prefills, steps, alone)
    step_ms, kept = _step_latencies(models, steps, min_steps)
    alone_ms, beside_ms, by_state = _by_state(models, steps, alone, min_steps, fit_alone)
    visits = {x: int(round(n)) for x, n in win.visits.items()}
    tokens = sum(win.tokens.values())
    prefill = _prefill_costs(models, prefills, step_ms, alone_ms, beside_ms, tokens, win.ended,
                             None if win.counts_first else visits)  # fmt: skip
    routing, counts = _routing(models, win, committed if committed is not None else policy_routing(plan).keep)
    workload = {
        "source": source or "metrics",
        "generated_tokens": int(tokens),
        "min_steps": min_steps,
        "steps": kept,
        **_served(models, win, min_steps),
        **({"stalls": stalls} if stalls else {}),
        **_alone_notes(models, alone, alone_ms, by_state, fit_alone),
        **({"requests": {"ended": int(round(win.ended)), "visited": visits}} if visits and win.ended > 0 else {}),
        **({"prefill_steps": "first runs" if win.counts_first else f"longest row > {prefill_above}"}
           if prefill_above is not None else {}),
    }  # fmt: skip
    return Profile(
        policy=plan["policy"]["name"],
        source_sha256=plan.get("source", {}).get("sha256"),
        step_ms=step_ms,
        routing=routing,
        counts=counts,
        device="serving metrics",
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        workload=workload,
        alone_ms=alone_ms,
        beside_ms=beside_ms,
        prefill=prefill,
    )


def _steps_less_stalls(win: Counters) -> tuple[Tables, dict[str, dict[int, int]]]:
    """Per model {batch size: [steps, seconds]} less the stalls (which the profile's `workload.stalls` lists)."""
    steps: Tables = {}
    stalls: dict[str, dict[int, int]] = {}
    for x, c in sorted(win.models.items()):
        table = steps[x] = {bs: list(v[:2]) for bs, v in c.by_bs.items()}
        for bs, (n, sec) in c.slow_by_bs.items():
            row = table.setdefault(bs, [0.0, 0.0])
            row[0] -= n
            row[1] -= sec
            if n > 0:
                stalls.setdefault(x, {})[bs] = int(round(n))
    return steps, {x: dict(sorted(v.items())) for x, v in stalls.items()}


def _prefill_steps(win: Counters, prefill_above: int | None) -> Prefills:
    """Per model, the prefill steps by (batch size, overlap): [steps, seconds, first runs]: those that ran a
    request's first tokens where the server counts them, else those whose longest row ran more than
    `prefill_above` new tokens; none where `prefill_above` is None. A stall is left out of its batch size
    already, by the slow-step counters."""
    out: Prefills = {}
    if prefill_above is None:
        return out
    for x, c in win.models.items():
        shapes = c.first_by_shape if win.counts_first else c.by_shape
        for (bs, q, overlap), (n, sec, count) in shapes.items():
            if overlap == "stall" or not (win.counts_first or q > prefill_above):
                continue
            row = out.setdefault(x, {}).setdefault((bs, overlap), [0.0, 0.0, 0.0])
            row[0] += n
            row[1] += sec
            row[2] += count if win.counts_first else 0.0
    return out


def _leave_out_prefills(prefills: Prefills, steps: Tables, alone: Tables) -> None:
    """The prefill steps leave their batch sizes' latencies, the alone ones the latencies alone too."""
    for x, by in prefills.items():
        for (bs, overlap), (n, sec, _) in by.items():
            for table in (steps, alone) if overlap == "alone" else (steps,):
                row = table.setdefault(x, {}).setdefault(bs, [0.0, 0.0])
                row[0] -= n
                row[1] -= sec


def _step_latencies(models: list[str], steps: Tables, min_steps: int):
    """Each model's L(b) over the batch sizes run `min_steps` times or more, and the steps behind each."""
    step_ms: dict[str, StepLatency] = {}
    kept: dict[str, dict[str, int]] = {}
    for x in models:
        rows = sorted(steps.get(x, {}).items())
        pts = [(bs, 1000.0 * sec / n) for bs, (n, sec) in rows if n >= min_steps]
        kept[x] = {str(bs): int(round(n)) for bs, (n, _) in rows if n >= min_steps}
        if not pts:
            seen = {bs: int(n) for bs, (n, _) in rows}
            raise MetricsProfileError(
                f"model {x!r}: no batch size ran {min_steps} times or more (steps by batch size: {seen or 'none'});"
                " put more load on the server before reading its metrics"
            )
        step_ms[x] = StepLatency(tuple(pts))
    return step_ms, kept


def _routing(models: list[str], win: Counters, committed: dict[str, dict[str, float]]):
    """p_ij and the counts behind it: a decision writes a token (staying, or a hop that keeps it) or hops and drops
    it, so i's decisions are its tokens plus its dropping hops (`committed`: x -> {y: share of x -> y hops that
    keep their token})."""
    counts: dict[str, dict[str, int]] = {}
    routing: dict[str, dict[str, float]] = {}
    for x in models:
        row = {y: int(round(n)) for (a, y), n in win.hops.items() if a == x and y != x and n > 0}
        dropped = sum(n * (1.0 - committed.get(x, {}).get(y, 1.0)) for y, n in row.items())
        decisions = int(round(win.tokens.get(x, 0.0) + dropped))
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
    return routing, counts


def _served(models: list[str], win: Counters, min_steps: int) -> dict[str, Any]:
    """The workload's record of how the server ran: the thresholds B_i, each model's busy share of the window
    (step seconds over uptime; a server that reports no uptime gives none), and where the server counts them the
    mean host ms between back-to-back steps (`gap_ms`) and ms of delay per hop received (`hop_ms`)."""
    c = {x: win.models[x] for x in models if x in win.models}
    thresholds = {x: m.threshold for x, m in c.items() if m.threshold > 0}
    busy = {x: m.busy[0] / m.busy[1] for x, m in c.items() if m.busy[1] > 0}
    means = {
        what: {x: 1000.0 * getattr(m, row)[1] / getattr(m, row)[0] for x, m in c.items()
               if getattr(m, row)[0] >= min_steps}
        for what, row in (("gap_ms", "gaps"), ("hop_ms", "hops_in"))
    }  # fmt: skip
    return {
        **({"thresholds": thresholds} if thresholds else {}),
        **({"busy_share": busy} if busy else {}),
        **{what: ms for what, ms in means.items() if ms},
    }


def _alone_notes(models, alone: Tables, alone_ms, by_state, fit_alone: bool) -> dict[str, Any]:
    """The workload's notes on the latencies alone: the steps behind them, how they were fitted, and where the board
    counted steps alone but too few for any model's latencies alone, how many (`tune` warns: on the H200 the 0.6B
    alone in 16 steps of a 4-round eager profile, and the plain chain chose a threshold 12 % slower)."""
    too_few: dict[str, int] = {}
    if not alone_ms:
        for x in models:
            if n := int(round(sum(c for c, _ in alone.get(x, {}).values()))):
                too_few[x] = n
    return {
        **({"steps_by_state": by_state} if by_state else {}),
        **({"alone_fit": "non-decreasing"} if by_state and fit_alone else {}),
        **({"alone_too_few": too_few} if too_few else {}),
    }


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
    them (`_alone_latency`)."""
    alone_ms: dict[str, StepLatency] = {}
    beside_ms: dict[str, StepLatency] = {}
    counts: dict[str, dict[str, Any]] = {}  # model -> steps alone and beside by batch size (and the ratio)
    for x in models:
        every = alone.get(x, {})
        rest = _less_alone(steps.get(x, {}), every, min_steps)
        if not rest:
            continue
        beside = StepLatency(tuple((bs, 1000.0 * sec / n) for bs, (n, sec) in sorted(rest.items())))
        found = _alone_latency(every, beside, min_steps, fit)
        if found is None:
            continue
        alone_ms[x], lone, scaled, pooled = found
        beside_ms[x] = beside
        counts[x] = _state_counts(lone, rest, scaled, pooled)
    return alone_ms, beside_ms, counts


def _less_alone(steps: dict, every: dict, min_steps: int) -> dict:
    """Per batch size, (steps, seconds) of every step less the alone ones, where `min_steps` or more remain."""
    rest = {}
    for bs, (n, sec) in steps.items():
        an, asec = every.get(bs, (0.0, 0.0))
        if n - an >= min_steps and sec - asec > 0:
            rest[bs] = (n - an, sec - asec)
    return rest


def _state_counts(lone: dict, rest: dict, scaled, pooled) -> dict[str, Any]:
    """The steps alone and beside by batch size behind a model's latencies (and how the alone ones were fitted)."""
    return {
        "alone": {str(bs): int(round(n)) for bs, (n, _) in sorted(lone.items())},
        "beside": {str(bs): int(round(n)) for bs, (n, _) in sorted(rest.items())},
        **({"alone_scaled_by": scaled} if scaled is not None else {}),
        **({"alone_pooled": pooled} if pooled else {}),
    }


def _alone_latency(every: dict, beside: StepLatency, min_steps: int, fit: bool):
    """A model's latency alone from its alone steps `every` ({batch size: [steps, seconds]}): (the latency, the
    steps behind it by batch size, the ratio it scaled `beside` by or None, the runs of batch sizes the fit
    pooled); None where the alone steps are too few. Alone steps are rare where the co-runner is seldom idle (an
    eager profile: the 0.6B runs alone only while the 8B holds no request), so when no batch size has
    `min_steps` of them but all of them together do, the latency alone is `beside` scaled by the ratio those
    steps show (their time over what the same steps take beside), which keeps the shape of the latency over the
    batch size."""
    lone = {bs: (n, sec) for bs, (n, sec) in every.items() if n >= min_steps}
    if lone:
        means = [(bs, 1000.0 * sec / n, n) for bs, (n, sec) in sorted(lone.items())]
        fitted, pooled = non_decreasing(means) if fit else ([(bs, ms) for bs, ms, _ in means], [])
        return StepLatency(tuple(fitted)), lone, None, pooled
    if sum(n for n, _ in every.values()) < min_steps:
        return None
    scaled = sum(1000.0 * sec for _, sec in every.values()) / sum(
        n * beside.at(bs) for bs, (n, _) in every.items()
    )
    lone = {bs: v for bs, v in every.items() if v[0] > 0}
    return StepLatency(tuple((bs, ms * scaled) for bs, ms in beside.points)), lone, scaled, []


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
