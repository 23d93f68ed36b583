"""`tokenrouter tune --request-rate`: the thresholds with the lowest latency at an offered load, by simulation
(`throughput.rate_tune`), written into the plan."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from tokenrouter.outfile import finite_json
from tokenrouter.throughput.commands.common import (
    SystemArgs,
    build_system,
    describe_inputs,
    format_rows,
    warn,
    write_tuned,
)
from tokenrouter.throughput.commands.options import (
    gap_line,
    hop_line,
    parse_gap_ms,
    parse_hop_ms,
    unused_lines,
)
from tokenrouter.throughput.optimize import TuneError
from tokenrouter.throughput.plan_inputs import (
    PlanSystem,
    ThroughputInputError,
    ThroughputUsageError,
    concentration_warnings,
)
from tokenrouter.throughput.rate_tune import BEYOND_SHARE, RateSettings, beyond_warnings, tune_at_rate
from tokenrouter.throughput.tuned_plan import apply_tuning


def run_rate_tune(
    args: SystemArgs,
    rate: dict,
    output: str | None = None,
    as_json: bool = False,
    top: int = 10,
    write: bool = True,
) -> tuple[str, dict]:
    """`tune --request-rate`: the thresholds with the lowest latency at an offered load (`rate_tune`). `rate`
    holds `RateSettings`' fields but the request tokens (`args`), with `max_delay_ms` None for the plan's and
    `hop_ms` as `MODEL=MS` items; `jobs` None for one process per CPU, up to 8."""
    rate = _checked(args, rate, top)
    plan, system = build_system(args)
    settings = _settings(args, rate, plan, system)
    try:
        result = tune_at_rate(system.inputs, settings, system.fixed, system.profiled())
    except TuneError as e:
        raise ThroughputInputError(str(e)) from None
    late = _warnings(system, result, settings)
    warn(late)
    tuned = apply_tuning(plan, system, result, top=top, warnings=late)
    out_path = write_tuned(tuned, args, output, write)
    if as_json:
        payload = {"plan": str(out_path) if write else None, "tuning": tuned["tuning"], "plot": None}
        return json.dumps(finite_json(payload), indent=2), tuned
    return "\n".join(_rate_lines(plan, system, result, top, out_path if write else None)), tuned


def _checked(args: SystemArgs, rate: dict, top: int) -> dict:
    """`rate` with its default process count, checked before any work."""
    if top < 1:
        raise ThroughputUsageError(f"--top must be >= 1, got {top}")
    if args.request_tokens is None:
        raise ThroughputUsageError(
            "--request-rate (an open loop) needs --request-tokens: the tokens a request commits"
        )
    rate = dict(rate)
    if rate.get("jobs") is None:
        rate["jobs"] = max(1, min(os.cpu_count() or 1, 8))
    try:
        RateSettings(
            request_tokens=args.request_tokens,
            **{k: v for k, v in rate.items() if k not in ("hop_ms", "gap_ms")},
        )
    except ValueError as e:
        raise ThroughputUsageError(str(e)) from None
    return rate


def _settings(args: SystemArgs, rate: dict, plan: dict, system: PlanSystem) -> RateSettings:
    """The settings, with the plan's timeout where none was given and the hop delays and host gaps per model."""
    models = system.inputs.models
    if rate.get("max_delay_ms") is None:
        rate["max_delay_ms"] = float(plan["serve"]["max_delay_ms"])
    rate["hop_ms"] = parse_hop_ms(rate.get("hop_ms"), models, system.hop_ms)
    rate["gap_ms"] = parse_gap_ms(rate.get("gap_ms"), models, system.gap_ms)
    return RateSettings(request_tokens=args.request_tokens, **rate)


def _warnings(system: PlanSystem, result, settings: RateSettings) -> list[str]:
    best = result.best
    late = concentration_warnings(system, best.thresholds)
    if best.unpriced:
        b_star = ", ".join(f"{m} {b}" for m, b in zip(result.models, best.thresholds, strict=True))
        late += [
            f"B* = {b_star}: {line}" for line in beyond_warnings(result.models, best.beyond, result.limits)
        ]
    if best.behind:
        late.append(
            f"every candidate fell behind {settings.rate_per_s:g} requests/s (more than 2N waiting at the cap at the "
            "end of a run): the rate is over what the plan serves at this N, and the latencies are of the requests "
            "that ended"
        )
    return late


def _rate_lines(plan: dict, system: PlanSystem, result, top: int, wrote: Path | None) -> list[str]:
    lines = _header(plan, system, result) + _table(result, top) + _choice(result)
    if wrote is not None:
        lines.append(f"wrote {wrote} (batch for {', '.join(system.auto) or 'no auto model'})")
    return lines


def _header(plan: dict, system: PlanSystem, result) -> list[str]:
    """The load, the search, and the inputs."""
    s, models = result.settings, result.models
    lines = [
        f"tune {plan['policy']['name']} at {s.rate_per_s:g} requests/s (Poisson, at most N = {result.concurrency} in "
        f"flight, {s.request_tokens} tokens each, max_delay_ms {s.max_delay_ms:g}) for the lowest {s.objective}: "
        f"{result.n_feasible} feasible candidate" + ("s" if result.n_feasible != 1 else "")
    ]
    if result.unpriced:
        lines.append(_unpriced_line(result))
    lines.append(_runs_line(result))
    lines += describe_inputs(system)
    if s.hop_ms is not None:
        lines.append(hop_line(models, s.hop_ms))
    if s.gap_ms is not None:
        lines.append(gap_line(models, s.gap_ms))
    lines += unused_lines(system, s.hop_ms, s.gap_ms)
    if system.fixed:
        lines.append("fixed: " + ", ".join(f"{m} {b}" for m, b in system.fixed.items()))
    return lines


def _unpriced_line(result) -> str:
    sizes = ", ".join(f"{m} up to {t}" for m, t in zip(result.models, result.limits, strict=True)
                      if math.isfinite(t))  # fmt: skip
    return (
        f"  {result.unpriced} ran more than {BEYOND_SHARE:.0%} of a model's steps with more rows than its step "
        f"latency was measured at ({sizes}): those steps are priced as the largest measured, so they rank after "
        "the others"
    )


def _runs_line(result) -> str:
    """How the candidates were simulated."""
    s = result.settings
    if result.screened:
        return (
            f"  {len(result.screened)} simulated once over {s.screen_ms / 1000:g} s, the best {len(result.results)} "
            f"again over {s.horizon_ms / 1000:g} s with {s.seeds} seeds (the same arrivals for each), "
            f"after a {s.warmup_ms / 1000:g} s warm-up: {result.seconds:.1f} s in {s.jobs} processes"
        )
    return (
        f"  {len(result.results)} simulated over {s.horizon_ms / 1000:g} s with {s.seeds} seeds (the same "
        f"arrivals for each), after a {s.warmup_ms / 1000:g} s warm-up: {result.seconds:.1f} s in {s.jobs} processes"
    )


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def _cell(x: float, spec: str) -> str:  # "-": no request measured
    return "-" if math.isnan(x) else format(x, spec)


def _table(result, top: int) -> list[str]:
    """The best `top` candidates, ranked."""
    s, models = result.settings, result.models

    def behind(c) -> str:
        if c is result.best:
            return "-"
        mean, sd, lower = result.behind_best(c)
        if math.isnan(mean):
            return "-"
        return f"{mean:+.3g} ({sd:.2g}), {lower} of {len(c.scores)}" if len(c.scores) > 1 else f"{mean:+.3g}"

    head = ["rank", "B (" + ",".join(models) + ")", f"{s.objective} ms", "behind B*: ms (sd), seeds",
            "TTFT p50 ms", "TPOT p50 ms", "from arrival p50 / p99 s", "tok/s", "backlog",
            "steps beyond measured"]  # fmt: skip
    rows = [
        [str(k + 1), ",".join(map(str, c.thresholds)), _ms(c.score), behind(c),
         _cell(c.latency['ttft_ms']['p50'], ".1f"), _cell(c.latency['tpot_ms']['p50'], ".3f"),
         f"{_cell(c.latency['from_arrival_ms']['p50'] / 1e3, '.2f')} / {_cell(c.latency['from_arrival_ms']['p99'] / 1e3, '.2f')}",
         f"{c.throughput:.0f}", str(c.backlog) + (" (behind)" if c.behind else ""),
         f"{max(c.beyond):.1%}" + (" (ranked after)" if c.unpriced else "")]
        for k, c in enumerate(result.results[:top])
    ]  # fmt: skip
    return format_rows(head, rows)


def _choice(result) -> list[str]:
    """B*, and a note where the runner-up is level with it within the seeds' spread."""
    s = result.settings
    lines = [
        "B* = " + ", ".join(f"{m} {b}" for m, b in result.best_thresholds().items())
        + (f" ({s.objective} {result.best.score:.4g} ms)" if not math.isnan(result.best.score) else
           f" (no request that arrived after the warm-up ended in the horizon: ranked by throughput, "
           f"{result.best.throughput:.0f} tok/s)")
    ]  # fmt: skip
    best, second = result.best, (result.results + [None])[1]
    if (
        second is not None
        and len(best.scores) > 1
        and (second.behind, second.unpriced) == (best.behind, best.unpriced)
    ):
        mean, sd, lower = result.behind_best(second)
        if not math.isnan(mean) and (lower < len(second.scores) or mean < 2 * sd):
            lines.append(
                f"note: {','.join(map(str, second.thresholds))} is {mean:.3g} ms behind on the mean (sd {sd:.2g} ms over "
                f"the seeds), and B* was lower in {lower} of {len(second.scores)} seeds: the two are level within what "
                "the simulation can tell; more --seeds or a longer --horizon-ms would rank them"
            )
    return lines
