"""The bodies of `tokenrouter tune` and `tokenrouter simulate` (cli.py holds only their signatures)."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tokenrouter.outfile import check_output, finite_json
from tokenrouter.throughput.dtmc import (
    DEFAULT_DELTA_MS,
    DEFAULT_MAX_STATES,
    ChainError,
    analyze,
    delta_error,
    with_transit,
)
from tokenrouter.throughput.inputs import with_step_ms
from tokenrouter.throughput.optimize import TuneError, TuneResult, tune
from tokenrouter.throughput.plan_inputs import (
    PlanSystem,
    ThroughputInputError,
    ThroughputUsageError,
    apply_tuning,
    beyond_profile_warnings,
    concentration_warnings,
    parse_p,
    parse_step_ms,
    system_from_plan,
    timeout_warnings,
)
from tokenrouter.throughput.profile_format import ProfileError, read_profile
from tokenrouter.throughput.rate_tune import (
    BEYOND_SHARE,
    RateSettings,
    beyond_shares,
    beyond_warnings,
    measured_sizes,
    tune_at_rate,
)
from tokenrouter.throughput.simulate import SimConfig, simulate, steps_error
from tokenrouter.throughput.timeout_check import check_timeout, current_thresholds


def load_plan(path: str, defines: dict[str, str] | None = None) -> dict:
    """A plan from a `.plan` file, or compiled from a `.tr` source (the throughput model reads no weights: a
    model folder or router file missing here is a warning of the compiler, not an error)."""
    from tokenrouter.compiler.driver import load_plan as load
    from tokenrouter.compiler.plan import PlanError

    try:
        return load(path, defines, weights_check=False)
    except PlanError as e:
        raise ThroughputInputError(str(e)) from None


def default_output(path: str) -> Path:
    return Path(path).with_suffix(".plan") if path.endswith(".tr") else Path(path)


@dataclass(slots=True)
class SystemArgs:
    plan_path: str
    concurrency: int | None
    step_ms: list[str] | None
    p: list[str] | None
    profile: str | None
    request_tokens: int | None = None  # tokens per request of the load to tune for (prices prompt prefills)


def build_system(args: SystemArgs) -> tuple[dict, PlanSystem]:
    plan = load_plan(args.plan_path)
    profile = None
    if args.profile:
        try:
            profile = read_profile(args.profile)
        except ProfileError as e:
            raise ThroughputInputError(str(e)) from None
    system = system_from_plan(
        plan, args.concurrency, parse_step_ms(args.step_ms), parse_p(args.p), profile, args.request_tokens
    )
    for line in system.warnings:
        print(f"warning: {line}", file=sys.stderr)
    return plan, system


def describe_inputs(system: PlanSystem) -> list[str]:
    inp = system.inputs
    steps = ", ".join(
        f"{m} {s.describe()} ({system.sources['step_ms'][m]})"
        for m, s in zip(inp.models, inp.step, strict=True)
    )
    probs = []
    for i, a in enumerate(inp.models):
        row = ", ".join(
            f"{a}→{b} {inp.p[i, j]:.4g}" + (" drop" if inp.c[i, j] == 0 else "")
            for j, b in enumerate(inp.models)
            if inp.p[i, j] > 0
        )
        probs.append(f"{row} ({system.sources['p'][a]})")
    lines = [f"step latency: {steps}", "routing: " + "; ".join(probs)]
    costs = [
        f"{m} {c.ms_per_token:.4g} ms per committed token"
        + (
            f", {c.ms_per_visit:.4g} ms per first run of a request on it"
            if c.ms_per_visit is not None
            else ""
        )
        for i, m in enumerate(inp.models)
        if (c := inp.prefill_at(i)) is not None
    ]
    if costs:
        lines.append(
            "prompt prefill, apart from the step latency: " + "; ".join(costs) + f" (profile; priced for "
            f"{system.prefill_for})"
        )
    return lines


def format_table(result: TuneResult, top: int) -> str:
    models = result.models
    head = ["rank", "B (" + ",".join(models) + ")", "T tok/s", "states"] + [f"util {m}" for m in models]
    rows = [
        [
            str(k + 1),
            ",".join(map(str, r.thresholds)),
            f"{r.throughput:.2f}" + (f" ±{r.stderr_tok_s:.2f}" if r.sampled_epochs else ""),
            str(r.n_states) if not r.sampled_epochs else "sampled",
        ]
        + [f"{u:.2f}" for u in r.utilization]
        for k, r in enumerate(result.results[:top])
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    return "\n".join(
        "  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)) for line in [head, *rows]
    )


def run_tune(
    args: SystemArgs,
    delta_ms: float = DEFAULT_DELTA_MS,
    output: str | None = None,
    as_json: bool = False,
    plot: str | None = None,
    top: int = 10,
    max_states: int = DEFAULT_MAX_STATES,
    write: bool = True,
    gap_ms: list[str] | None = None,
) -> tuple[str, dict]:
    """Returns (text to print, the tuned plan). Raises ThroughputInputError for the user's mistakes. `gap_ms`:
    `MODEL=MS` items (or `profile`), host time each step of a model takes beyond its latency, which the chain
    adds to every step of it (`inputs.with_step_ms`)."""
    if not (math.isfinite(delta_ms) and delta_ms > 0):
        raise ThroughputUsageError(f"--delta-ms must be a finite number of ms > 0, got {delta_ms}")
    if top < 1:
        raise ThroughputUsageError(f"--top must be >= 1, got {top}")
    if max_states < 1:
        raise ThroughputUsageError(f"--max-states must be >= 1, got {max_states}")
    if plot:
        check_plot_path(plot)
    plan, system = build_system(args)
    gaps = parse_gap_ms(gap_ms, system.inputs.models, system.gap_ms)
    chain_inputs = system.inputs if gaps is None else with_step_ms(system.inputs, gaps)
    if error := delta_error(chain_inputs, delta_ms):
        raise ThroughputUsageError(error)
    try:
        result = tune(chain_inputs, system.fixed, delta_ms=delta_ms, max_states=max_states)
    except TuneError as e:
        raise ThroughputInputError(str(e)) from None
    if not result.best.throughput > 0:
        raise ThroughputInputError(
            "every candidate's predicted throughput is 0 tok/s (no step commits a token?): nothing to choose "
            "B* by; the plan was not written"
        )
    late = timeout_warnings(plan, system.inputs.models, result.best)
    check = check_timeout(plan, chain_inputs, result.best.thresholds) if late else None
    if check is not None:
        late.append(check.line())
        if check.keep_current:
            _keep_current(result, check)
            late = [*timeout_warnings(plan, system.inputs.models, result.best), check.line()]
    late += beyond_profile_warnings(system.inputs, result.best)
    late += concentration_warnings(system, result.best.thresholds)
    for line in late:
        print(f"warning: {line}", file=sys.stderr)
    tuned = apply_tuning(plan, system, result, top=top, warnings=late, gap_ms=gaps)
    if check is not None:
        tuned["tuning"]["timeout_check"] = check.as_dict()
    out_path = _write_tuned(tuned, args, output, write)
    lines: list[str] = []
    if plot:
        from tokenrouter.throughput.plot import plot_tuning

        try:
            plot_tuning(result, plot, title=f"{plan['policy']['name']}: T(B) at N = {result.concurrency}")
        except OSError as e:
            raise ThroughputInputError(f"cannot write {plot}: {e}") from None
    if as_json:
        payload = {"plan": str(out_path) if write else None, "tuning": tuned["tuning"], "plot": plot}
        return json.dumps(finite_json(payload), indent=2), tuned
    best = result.best
    lines.append(
        f"tune {plan['policy']['name']}: N = {result.concurrency}, δ = {result.delta_ms:g} ms, {result.method} "
        f"search: {len(result.results)} of {result.n_feasible} feasible candidates evaluated in {result.seconds:.2f} s"
    )
    if result.sampling:
        from tokenrouter.throughput.large_n import describe

        lines.append(describe(result))
    lines += describe_inputs(system)
    if gaps is not None:
        lines.append(gap_line(system.inputs.models, gaps) + " (added to every step in the chain)")
    lines += unused_note(GAPS, "--gap-ms profile", system.gap_ms, gaps, "the chain")
    if system.fixed:
        lines.append("fixed: " + ", ".join(f"{m} {b}" for m, b in system.fixed.items()))
    lines.append(format_table(result, top))
    current = current_thresholds(plan, system.inputs.models)
    for b, msg in result.failed.items():
        mine = " (the plan's setting)" if b == current else ""
        lines.append(f"not evaluated: B = {','.join(map(str, b))}{mine}: {msg}")
    lines.append(
        ("B* = " if result.chosen == 0 else "kept the plan's setting over the chain's B* (the timeout): ")
        + ", ".join(f"{m} {b}" for m, b in result.best_thresholds().items())
        + f" (T = {best.throughput:.2f} tok/s)"
    )
    if system.hop_ms and best.throughput > 0:
        hops = tuple(system.hop_ms.get(m, 0.0) for m in system.inputs.models)
        lines.append(
            "note: the profile's hops took "
            + ", ".join(f"{ms:.3g} ms into {m}" for m, ms in system.hop_ms.items())
            + f", which the chain takes as instant; with that transit B* serves about "
            f"{with_transit(chain_inputs, best, hops):.0f} tok/s (a delay per token beside the chain, the same "
            "share off every candidate)"
        )
    if write:
        lines.append(f"wrote {out_path} (batch for {', '.join(system.auto) or 'no auto model'})")
    if plot:
        lines.append(f"wrote {plot}")
    return "\n".join(lines), tuned


def _keep_current(result: TuneResult, check) -> None:
    """Choose the plan's setting over B* (`timeout_check`); refused where the chain did not evaluate it."""
    thresholds = [r.thresholds for r in result.results]
    if check.current not in thresholds:
        why = result.failed.get(check.current, "it was not among the candidates searched")
        raise ThroughputInputError(
            f"{check.simulated()}: the plan's setting serves better, but the chain could not evaluate it "
            f"({why}), so there is no tuning of it to record: the plan was not written"
        )
    result.chosen = thresholds.index(check.current)


def _write_tuned(tuned: dict, args: SystemArgs, output: str | None, write: bool) -> Path:
    """Where the tuned plan goes (`-o`, else the input plan, or FILE.plan for a source), written there unless
    `write` is off."""
    out_path = Path(output) if output else default_output(args.plan_path)
    if write:
        from tokenrouter.compiler.plan import PlanError, write_plan

        try:
            write_plan(tuned, out_path, inputs=[args.profile] if args.profile else [])
        except (OSError, PlanError) as e:
            raise ThroughputInputError(f"cannot write {out_path}: {e}") from None
    return out_path


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
    except ValueError as e:  # before any work
        raise ThroughputUsageError(str(e)) from None
    plan, system = build_system(args)
    inp = system.inputs
    if rate.get("max_delay_ms") is None:
        rate["max_delay_ms"] = float(plan["serve"]["max_delay_ms"])
    rate["hop_ms"] = parse_hop_ms(rate.get("hop_ms"), inp.models, system.hop_ms)
    rate["gap_ms"] = parse_gap_ms(rate.get("gap_ms"), inp.models, system.gap_ms)
    settings = RateSettings(request_tokens=args.request_tokens, **rate)
    try:
        result = tune_at_rate(inp, settings, system.fixed, system.profiled())
    except TuneError as e:
        raise ThroughputInputError(str(e)) from None
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
    for line in late:
        print(f"warning: {line}", file=sys.stderr)
    tuned = apply_tuning(plan, system, result, top=top, warnings=late)
    out_path = _write_tuned(tuned, args, output, write)
    if as_json:
        payload = {"plan": str(out_path) if write else None, "tuning": tuned["tuning"], "plot": None}
        return json.dumps(finite_json(payload), indent=2), tuned
    return "\n".join(_rate_lines(plan, system, result, top, out_path if write else None)), tuned


def _rate_lines(plan: dict, system: PlanSystem, result, top: int, wrote: Path | None) -> list[str]:
    s, models = result.settings, result.models
    lines = [
        f"tune {plan['policy']['name']} at {s.rate_per_s:g} requests/s (Poisson, at most N = {result.concurrency} in "
        f"flight, {s.request_tokens} tokens each, max_delay_ms {s.max_delay_ms:g}) for the lowest {s.objective}: "
        f"{result.n_feasible} feasible candidate" + ("s" if result.n_feasible != 1 else "")
    ]
    if result.unpriced:
        sizes = ", ".join(f"{m} up to {t}" for m, t in zip(models, result.limits, strict=True)
                          if math.isfinite(t))  # fmt: skip
        lines.append(
            f"  {result.unpriced} ran more than {BEYOND_SHARE:.0%} of a model's steps with more rows than its step "
            f"latency was measured at ({sizes}): those steps are priced as the largest measured, so they rank after "
            "the others"
        )
    if result.screened:
        lines.append(
            f"  {len(result.screened)} simulated once over {s.screen_ms / 1000:g} s, the best {len(result.results)} "
            f"again over {s.horizon_ms / 1000:g} s with {s.seeds} seeds (the same arrivals for each), "
            f"after a {s.warmup_ms / 1000:g} s warm-up: {result.seconds:.1f} s in {s.jobs} processes"
        )
    else:
        lines.append(
            f"  {len(result.results)} simulated over {s.horizon_ms / 1000:g} s with {s.seeds} seeds (the same "
            f"arrivals for each), after a {s.warmup_ms / 1000:g} s warm-up: {result.seconds:.1f} s in {s.jobs} processes"
        )
    lines += describe_inputs(system)
    if s.hop_ms is not None:
        lines.append("hop delay into each model: " + ", ".join(
            f"{m} {ms:g} ms" for m, ms in zip(models, s.hop_ms, strict=True)))  # fmt: skip
    if s.gap_ms is not None:
        lines.append(gap_line(models, s.gap_ms))
    lines += unused_lines(system, s.hop_ms, s.gap_ms)
    if system.fixed:
        lines.append("fixed: " + ", ".join(f"{m} {b}" for m, b in system.fixed.items()))

    def ms(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"

    def cell(x: float, spec: str) -> str:  # "-": no request measured
        return "-" if math.isnan(x) else format(x, spec)

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
        [str(k + 1), ",".join(map(str, c.thresholds)), ms(c.score), behind(c),
         cell(c.latency['ttft_ms']['p50'], ".1f"), cell(c.latency['tpot_ms']['p50'], ".3f"),
         f"{cell(c.latency['from_arrival_ms']['p50'] / 1e3, '.2f')} / {cell(c.latency['from_arrival_ms']['p99'] / 1e3, '.2f')}",
         f"{c.throughput:.0f}", str(c.backlog) + (" (behind)" if c.behind else ""),
         f"{max(c.beyond):.1%}" + (" (ranked after)" if c.unpriced else "")]
        for k, c in enumerate(result.results[:top])
    ]  # fmt: skip
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    lines += ["  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)) for line in [head, *rows]]
    lines.append(
        "B* = " + ", ".join(f"{m} {b}" for m, b in result.best_thresholds().items())
        + (f" ({s.objective} {result.best.score:.4g} ms)" if not math.isnan(result.best.score) else
           f" (no request that arrived after the warm-up ended in the horizon: ranked by throughput, "
           f"{result.best.throughput:.0f} tok/s)")
    )  # fmt: skip
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
    if wrote is not None:
        lines.append(f"wrote {wrote} (batch for {', '.join(system.auto) or 'no auto model'})")
    return lines


def check_plot_path(plot: str) -> None:
    """`--plot`'s file, before any work (and before the plan is rewritten): a .png name (the chart is a PNG, and
    matplotlib would add the suffix to a name without one) in a folder that exists."""
    path = Path(plot)
    if path.suffix.lower() != ".png":
        raise ThroughputUsageError(f"--plot takes a .png file name, got {plot!r}")
    if path.is_dir():
        raise ThroughputUsageError(f"--plot {plot}: is a folder, not a file name")
    if not path.absolute().parent.is_dir():
        raise ThroughputUsageError(f"--plot {plot}: no folder {path.absolute().parent}")


def parse_model_values(values, models, option: str, value: str, convert, valid, rule: str) -> dict:
    """`OPTION MODEL=VALUE` items as {model: convert(VALUE)}: a usage error for a malformed item, a bad number
    or one that is not `valid` (`rule` says what is), an input error for a model the plan lacks."""
    out = {}
    for item in values or []:
        name, sep, val = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ThroughputUsageError(f"bad {option} '{item}': expected MODEL={value}")
        if name not in models:
            raise ThroughputInputError(f"unknown model '{name}' (the plan's models: {', '.join(models)})")
        try:
            x = convert(val)
        except ValueError:
            kind = "an int" if convert is int else "a number"
            raise ThroughputUsageError(f"bad {option} '{item}': {val!r} is not {kind}") from None
        if not valid(x):
            raise ThroughputUsageError(f"bad {option} '{item}': {rule}")
        if name in out:
            raise ThroughputUsageError(f"{option} gives {name} twice ({name}={out[name]:g} and '{item}')")
        out[name] = x
    return out


def parse_batch(values: list[str] | None, models: tuple[str, ...]) -> dict[str, int]:
    return parse_model_values(
        values, models, "--batch", "B", int, lambda b: b >= 1, "a threshold must be >= 1"
    )


def parse_hop_ms(
    values: list[str] | None, models: tuple[str, ...], measured: dict[str, float] | None = None
) -> tuple[float, ...] | None:
    """`--hop-ms MODEL=MS`: a hop's transit into each model (0 for those not given), or None when none is;
    `--hop-ms profile`: the profile's measured delays (`measured`, `PlanSystem.hop_ms`)."""
    return parse_model_ms(values, models, measured, "--hop-ms", "hop delays (workload.hop_ms")


def parse_gap_ms(
    values: list[str] | None, models: tuple[str, ...], measured: dict[str, float] | None = None
) -> tuple[float, ...] | None:
    """`--gap-ms MODEL=MS`: each model's host time per step beyond its step latency (0 for those not given), or
    None when none is; `--gap-ms profile`: the profile's measured gaps (`measured`, `PlanSystem.gap_ms`)."""
    return parse_model_ms(values, models, measured, "--gap-ms", "step gaps (workload.gap_ms")


GAPS = "host time between back-to-back steps"


def unused_lines(system: PlanSystem, hop_ms, gap_ms) -> list[str]:
    """A note where the profile measured hop delays or host gaps that the simulation was not given."""
    return unused_note("hop delays", "--hop-ms profile", system.hop_ms, hop_ms) + unused_note(
        GAPS, "--gap-ms profile", system.gap_ms, gap_ms
    )


def unused_note(what: str, option: str, measured, given, by: str = "this simulation") -> list[str]:
    """A note where the profile measured `what` (`measured`: per model, ms) and `by` was not `given` it."""
    if not measured or given is not None:
        return []
    values = ", ".join(f"{m} {ms:.3g} ms" for m, ms in measured.items())
    return [
        f"note: the profile measured {what} ({values}), which {by} leaves out; `{option}` adds them (nearer what "
        "serves)"
    ]


def gap_line(models: tuple[str, ...], gaps: tuple[float, ...]) -> str:
    return "host time per step beyond its latency: " + ", ".join(
        f"{m} {ms:g} ms" for m, ms in zip(models, gaps, strict=True)
    )


def parse_model_ms(values, models, measured, option: str, what: str) -> tuple[float, ...] | None:
    """`OPTION MODEL=MS …` as ms per model in the plan's order (0 for those not given), None when none is given;
    `OPTION profile`: the profile's measured values (`measured`; an input error without them)."""
    if not values:
        return None
    if "profile" in values:
        if len(values) > 1:
            raise ThroughputUsageError(
                f"{option} profile takes the profile's values for every model: give it alone"
            )
        if measured is None:
            raise ThroughputUsageError(
                f"{option} profile takes the {what[: what.index(' (')]} of --profile FILE: give one"
            )
        if not measured:
            raise ThroughputInputError(
                f"{option} profile: the profile has no {what}: a profile from serving metrics, `tokenrouter profile "
                "--from-metrics`, of a server that counted them)"
            )
        return tuple(measured.get(m, 0.0) for m in models)
    given = parse_model_values(values, models, option, "MS", float, lambda ms: math.isfinite(ms) and ms >= 0,
                               "a time must be a finite number of ms >= 0")  # fmt: skip
    return tuple(given.get(m, 0.0) for m in models)


def _replayed_arrivals(path: str, args: SystemArgs, cfg_kw: dict, requests: str | None) -> dict:
    """`simulate --arrivals REPORT`: the settings of an open loop on the report's arrival times. Its requests
    are as long as `--request-tokens` (default: the report's output length), at most `-n` in flight (default: the
    report's cap); every one is measured (no warm-up), and the run ends with the last one, or `--horizon-ms`
    after the last arrival. `args` takes those defaults."""
    from tokenrouter.throughput.workload import WorkloadError, read_arrivals

    if requests is not None or cfg_kw.get("arrival_rate_per_s") is not None:
        raise ThroughputUsageError(
            "--arrivals replays a report's open loop: give no --requests or --request-rate"
        )
    try:
        times, length, cap = read_arrivals(path)
    except WorkloadError as e:
        raise ThroughputInputError(str(e)) from None
    if args.request_tokens is None:
        if length is None:
            raise ThroughputUsageError(f"{path} has no spec.output_len: give --request-tokens")
        args.request_tokens = length
    if args.concurrency is None:
        args.concurrency = cap
    return cfg_kw | {"arrivals_ms": times, "request_tokens": args.request_tokens, "warmup_ms": 0.0,
                     "horizon_ms": times[-1] + cfg_kw.get("horizon_ms", 60_000.0)}  # fmt: skip


def run_simulate(
    args: SystemArgs,
    batch: list[str] | None = None,
    cfg_kw: dict | None = None,
    as_json: bool = False,
    chain: bool = True,
    delta_ms: float = DEFAULT_DELTA_MS,
    requests: str | None = None,
    arrivals: str | None = None,
) -> str:
    """`requests`: a `tokenrouter bench --json` report whose per-request records the simulation replays as a
    finite run (`SimConfig.requests`, `throughput.workload`). `arrivals`: an open-loop report whose requests'
    arrival times it replays (`SimConfig.arrivals_ms`), every request measured, to the last one's end."""
    from tokenrouter.compiler.passes.check_feasibility import feasibility_error

    if not (math.isfinite(delta_ms) and delta_ms > 0):  # before any work, as `tune` checks it
        raise ThroughputUsageError(f"--delta-ms must be a finite number of ms > 0, got {delta_ms}")
    cfg_kw = dict(cfg_kw or {})
    if arrivals is not None:
        cfg_kw = _replayed_arrivals(arrivals, args, cfg_kw, requests)
    plan, system = build_system(args)
    inp = system.inputs
    if chain and (error := delta_error(inp, delta_ms)):
        raise ThroughputUsageError(error)
    if cfg_kw.get("arrival_rate_per_s") is not None and (
        requests is not None or cfg_kw.get("request_tokens") is None
    ):
        raise ThroughputUsageError("--request-rate (an open loop) needs --request-tokens, and no --requests")
    if requests is not None:
        from tokenrouter.throughput.workload import (
            WorkloadError,
            read_requests,
            request_lengths,
            request_routing,
            with_visit_costs,
        )

        try:
            per_request, output_len = read_requests(requests)
            cfg_kw["requests"] = tuple(request_routing(inp, per_request))
            inp = with_visit_costs(inp, per_request)
            lengths = request_lengths(per_request)
        except WorkloadError as e:
            raise ThroughputInputError(str(e)) from None
        if cfg_kw.get("request_tokens") is None:
            if output_len is None:
                raise ThroughputUsageError(f"{requests} has no spec.output_len: give --request-tokens")
            cfg_kw["request_tokens"] = output_len
            # each request as long as it ran (a .jsonl load's own lengths, or ends at EOS); --request-tokens
            # gives every request that many instead
            if lengths is not None and set(lengths) != {output_len}:
                cfg_kw["request_lengths"] = lengths
    hop_ms = parse_hop_ms(cfg_kw.pop("hop_ms", None), inp.models, system.hop_ms)
    if hop_ms is not None:
        cfg_kw["hop_ms"] = hop_ms
    gap_ms = parse_gap_ms(cfg_kw.pop("gap_ms", None), inp.models, system.gap_ms)
    if gap_ms is not None:
        cfg_kw["gap_ms"] = gap_ms
    given = parse_batch(batch, inp.models)
    thresholds = {}
    for m in inp.models:
        if m in given:
            thresholds[m] = given[m]
        elif plan["models"][m].get("batch") != "auto":
            thresholds[m] = int(plan["models"][m]["batch"])
        else:
            raise ThroughputInputError(
                f"model {m} has batch: auto; give --batch {m}=B or run `tokenrouter tune` on the plan first"
            )
    err = feasibility_error(thresholds, inp.concurrency)
    if err:
        raise ThroughputInputError(err)
    b = tuple(thresholds[m] for m in inp.models)
    # alike requests, as the chain's (a replay of a benchmark's requests has each request's own routing)
    if cfg_kw.get("requests") is None:
        for line in concentration_warnings(system, b):
            print(f"warning: {line}", file=sys.stderr)
    try:
        cfg = SimConfig(b, **cfg_kw)
    except ValueError as e:
        raise ThroughputUsageError(str(e)) from None
    if error := steps_error(inp, cfg):
        raise ThroughputUsageError(error)
    sim = simulate(inp, cfg)
    pred = None
    if chain and cfg.request_tokens is None and cfg.max_delay_ms is None and cfg.hop_ms is None:
        try:  # the chain takes the host gaps as longer steps (`tune --gap-ms`)
            pred = analyze(inp if cfg.gap_ms is None else with_step_ms(inp, cfg.gap_ms), b, delta_ms)
        except ChainError as e:
            pred = str(e)
    if as_json:
        out = {"simulation": sim.as_dict(inp.models)}
        if pred is not None:
            out["chain"] = pred if isinstance(pred, str) else pred.as_dict(inp.models)
        return json.dumps(finite_json(out), indent=2)
    if cfg.requests is None:
        span = f"{cfg.horizon_ms / 1000:g} s simulated after {cfg.warmup_ms / 1000:g} s warm-up"
        if cfg.arrival_rate_per_s is not None:
            span += f", an open loop of {cfg.arrival_rate_per_s:g} requests/s (Poisson), at most N in flight"
        elif cfg.arrivals_ms is not None:
            span = (
                f"an open loop of {arrivals}'s {len(cfg.arrivals_ms)} arrivals, at most N in flight, to the last "
                f"request's end: {sim.time_ms / 1000:.3f} s"
            )
    else:
        span = (
            f"a finite run of {len(cfg.requests)} requests from {requests} ("
            + (
                f"{min(cfg.request_lengths)}-{max(cfg.request_lengths)} tokens, each its own length and routing"
                if cfg.request_lengths
                else f"{cfg.request_tokens} tokens each, each request's own routing"
            )
            + f") to the last one's end: {sim.time_ms / 1000:.3f} s"
        )
    lines = [
        f"simulate {plan['policy']['name']}: N = {inp.concurrency}, B = "
        + ", ".join(f"{m} {x}" for m, x in thresholds.items())
        + f", {span}, seed {cfg.seed}",
        *describe_inputs(system),
        *(
            [
                "hop delay into each model: "
                + ", ".join(f"{m} {ms:g} ms" for m, ms in zip(inp.models, cfg.hop_ms, strict=True))
                + " (the chain takes hops as instant: not shown)"
            ]
            if cfg.hop_ms is not None
            else []
        ),  # fmt: skip
        *([gap_line(inp.models, cfg.gap_ms)] if cfg.gap_ms is not None else []),
        *unused_lines(system, cfg.hop_ms, cfg.gap_ms),
        f"throughput: {sim.throughput:.2f} tok/s"
        + (" (STALLED: every model idle, no queue at its threshold)" if sim.stalled else ""),
    ]
    if pred is not None and inp.prefill and any(inp.prefill):
        lines.append(
            "note: the chain spreads the prompt prefill costs over every step; requests that never end (no "
            "--request-tokens) prefill only in the warm-up here"
        )
    if isinstance(pred, str):
        lines.append(f"chain: not evaluated: {pred}")
    elif pred is not None:
        diff = (sim.throughput - pred.throughput) / pred.throughput * 100
        lines.append(f"chain (δ = {delta_ms:g} ms): {pred.throughput:.2f} tok/s (simulation {diff:+.2f}%)")
    for i, m in enumerate(inp.models):
        lines.append(
            f"  {m}: utilization {sim.utilization[i]:.3f}, mean batch {sim.mean_batch[i]:.2f}, "
            f"mean queue {sim.mean_queue[i]:.2f}, {sim.steps_per_s[i]:.1f} steps/s"
        )
    if cfg.request_tokens is not None:
        lines.append(f"finished requests: {sim.finished_requests}")
    if (lat := sim.latency) is not None:
        lines += [f"requests measured (arrived after the warm-up, ended in the horizon): {lat['measured']}"] + [
            f"  {label} p50 / p99: {lat[key]['p50'] * scale:.{digits}f} / {lat[key]['p99'] * scale:.{digits}f} {unit}"
            for label, key, scale, digits, unit in (
                ("TTFT", "ttft_ms", 1.0, 1, "ms"), ("TPOT", "tpot_ms", 1.0, 2, "ms"), ("E2E", "e2e_ms", 1e-3, 2, "s"),
                ("queued at the cap", "queued_ms", 1.0, 0, "ms"), ("from arrival to end", "from_arrival_ms", 1e-3, 2, "s"),
            )
        ]  # fmt: skip
        if lat["backlog"]:
            lines.append(
                f"warning: {lat['backlog']} requests were waiting at the cap at the end ({lat['unfinished']} measured "
                "arrivals had not ended): if it grows with --horizon-ms, the rate is over what the plan serves"
            )
    limits = measured_sizes(inp, system.profiled())
    lines += [
        f"warning: {x}"
        for x in beyond_warnings(inp.models, beyond_shares(sim.steps_by_batch, limits), limits)
    ]
    if cfg.requests is not None and sim.finished_requests < len(cfg.requests):
        lines.append(
            f"warning: the run was cut at --horizon-ms {cfg.horizon_ms:g} before its last request ended: "
            "raise it for the whole run"
        )
    return "\n".join(lines)


def run_profile_command(
    plan_path: str,
    output: str | None,
    batch_sizes: str,
    prompts: int,
    prompt_len: int,
    max_tokens: int,
    prompts_file: str | None,
    device: str | None,
    repeats: int,
    warmup: int,
    seed: int,
    from_metrics: str | None = None,
    since: str | None = None,
    min_steps: int = 5,
    colocation: list[str] | None = None,
    alone: str | None = None,
    merge: str | None = None,
    keep_prefills: bool = False,
) -> str:
    from tokenrouter.throughput.profile import ProfileConfig, ProfileRunError, run_profile

    if alone and not from_metrics:
        raise ThroughputUsageError("--alone goes with --from-metrics (the latencies beside the other models)")
    if merge and not from_metrics:
        raise ThroughputUsageError(
            "--merge goes with --from-metrics (the profile whose latencies it completes)"
        )
    if keep_prefills and not from_metrics:
        raise ThroughputUsageError(
            "--keep-prefills goes with --from-metrics (the steps a server counted by shape)"
        )
    if alone and merge:
        raise ThroughputUsageError(
            "give --alone or --merge, not both (--merge takes the latencies alone too)"
        )
    out = _profile_output(plan_path, output)
    try:  # before the measurement, which a bad output path would lose
        check_output(out, [plan_path])
    except OSError as e:
        raise ThroughputInputError(f"cannot write {out}: {e}") from None
    if colocation:
        if from_metrics or since:
            raise ThroughputUsageError(
                "--colocation reads two profiles: give it without --from-metrics/--since"
            )
        return _write_and_describe(_fit_colocation(plan_path, colocation), plan_path, output)
    if from_metrics:
        profile = _profile_from_metrics(plan_path, from_metrics, since, min_steps, keep_prefills)
        if alone:
            profile = _with_alone(plan_path, profile, alone)
        if merge:
            profile = _merged(profile, merge)
        return _write_and_describe(profile, plan_path, output)
    if since:
        raise ThroughputUsageError("--since needs --from-metrics")

    try:
        sizes = tuple(int(x) for x in batch_sizes.split(",") if x.strip())
    except ValueError:
        raise ThroughputUsageError(f"bad --batch-sizes '{batch_sizes}': expected ints like 1,2,4,8") from None
    texts: list[str] = []
    if prompts_file:
        try:
            texts = [
                line for line in Path(prompts_file).read_text(encoding="utf-8").splitlines() if line.strip()
            ]
        except (OSError, UnicodeDecodeError) as e:
            raise ThroughputInputError(f"cannot read {prompts_file}: {e}") from None
        if not texts:
            raise ThroughputInputError(f"{prompts_file} holds no prompts (one per line)")
    try:
        cfg = ProfileConfig(sizes, prompts, prompt_len, max_tokens, repeats, warmup, seed, 0.0, device, texts)
    except ValueError as e:
        raise ThroughputUsageError(str(e)) from None
    plan = load_plan(plan_path)
    try:
        profile = run_profile(plan, cfg)
    except ProfileRunError as e:
        raise ThroughputInputError(str(e)) from None
    return _write_and_describe(profile, plan_path, output)


def _read_metrics(where: str) -> str:
    """The Prometheus text at a server URL (its /metrics) or in a file."""
    import urllib.error
    import urllib.request

    if where.startswith(("http://", "https://")):
        url = where if where.rstrip("/").endswith("/metrics") else where.rstrip("/") + "/metrics"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                return resp.read().decode("utf-8", errors="replace")
        except (urllib.error.URLError, OSError) as e:
            raise ThroughputInputError(f"cannot read {url}: {getattr(e, 'reason', e)}") from None
    try:
        return Path(where).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ThroughputInputError(f"cannot read metrics file {where}: {e}") from None


def _profile_from_metrics(plan_path: str, where: str, since: str | None, min_steps: int, keep_prefills: bool):
    from tokenrouter.throughput.from_metrics import (
        PREFILL_ABOVE,
        MetricsProfileError,
        profile_from_metrics,
    )

    if min_steps < 1:
        raise ThroughputUsageError(f"--min-steps {min_steps}: expected an int >= 1")
    plan = load_plan(plan_path)
    before = _read_metrics(since) if since else None
    try:
        return profile_from_metrics(
            plan, _read_metrics(where), before, min_steps, source=where,
            prefill_above=None if keep_prefills else PREFILL_ABOVE,
        )  # fmt: skip
    except MetricsProfileError as e:
        raise ThroughputInputError(f"{where}: {e}") from None


def _with_alone(plan_path: str, served, path: str):
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
    import dataclasses

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


def _merged(base, path: str):
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
    import dataclasses

    from tokenrouter.throughput.inputs import StepLatency

    models = [m for m in base.step_ms if m in other.step_ms]
    if not models:
        raise ThroughputInputError(
            f"--merge {source}: no step latencies for {', '.join(base.step_ms)} (the models of this profile)"
        )

    def over(mine: dict, theirs: dict) -> dict:
        """`mine` with `theirs`' points at its batch sizes, for this profile's models only."""
        out = {}
        for m in base.step_ms:
            points = dict(mine[m].points) if m in mine else {}
            points.update(theirs[m].points if m in theirs else ())
            if points:
                out[m] = StepLatency(tuple(points.items()))
        return out

    alone_ms, seams = over(base.alone_ms, other.alone_ms), {}
    if base.workload.get("alone_fit") == "non-decreasing":
        alone_ms, seams = _refit_alone(alone_ms, base, other)
    return dataclasses.replace(
        base,
        step_ms=over(base.step_ms, other.step_ms),
        alone_ms=alone_ms,
        beside_ms=over(base.beside_ms, other.beside_ms),
        workload={
            **{k: v for k, v in base.workload.items() if not (k == "alone_too_few" and alone_ms)},
            "merged_from": source,
            "merged_batches": {m: sorted(b for b, _ in other.step_ms[m].points) for m in models},
            **({"merged_alone_pooled": seams} if seams else {}),
        },
    )


def _refit_alone(alone_ms: dict, base, other) -> tuple[dict, dict[str, list[list[int]]]]:
    """Merged latencies alone fitted non-decreasing again (`from_metrics.non_decreasing`), each batch size's mean
    weighted by the steps behind it in the profile it came from (`workload.steps_by_state.MODEL.alone`; 1 where
    a profile has no count): each profile was fitted on its own, and where one profile's batch sizes meet the
    other's the joined curve can fall. Returns the latencies and, per model, the batch sizes pooled."""
    from tokenrouter.throughput.from_metrics import non_decreasing
    from tokenrouter.throughput.inputs import StepLatency

    def steps(profile, model: str) -> dict[int, float]:
        alone = ((profile.workload.get("steps_by_state") or {}).get(model) or {}).get("alone") or {}
        return {int(bs): float(n) for bs, n in alone.items()}

    out, seams = dict(alone_ms), {}
    for m, latency in alone_ms.items():
        theirs = dict(other.alone_ms[m].points) if m in other.alone_ms else {}
        counts = {**steps(base, m), **{bs: n for bs, n in steps(other, m).items() if bs in theirs}}
        fitted, pooled = non_decreasing([(bs, ms, counts.get(bs) or 1.0) for bs, ms in latency.points])
        if pooled:
            out[m], seams[m] = StepLatency(tuple(fitted)), pooled
    return out, seams


def _fit_colocation(plan_path: str, paths: list[str]):
    from tokenrouter.throughput.colocation import ColocationError, fit

    if len(paths) != 2:
        raise ThroughputUsageError(
            f"--colocation takes two profiles (--colocation FIRST --colocation SECOND), got {len(paths)}"
        )
    plan = load_plan(plan_path)
    try:
        first, second = (read_profile(p) for p in paths)
        return fit(plan, first, second)
    except ProfileError as e:
        raise ThroughputInputError(str(e)) from None
    except ColocationError as e:
        raise ThroughputInputError(f"--colocation {paths[0]} {paths[1]}: {e}") from None


def _profile_output(plan_path: str, output: str | None) -> Path:
    return Path(output) if output else Path(plan_path).with_suffix(".profile.json")


def _write_and_describe(profile, plan_path: str, output: str | None) -> str:
    from tokenrouter.throughput.profile_format import write_profile

    out = _profile_output(plan_path, output)
    try:
        write_profile(profile, out, inputs=[plan_path])
    except OSError as e:
        raise ThroughputInputError(f"cannot write {out}: {e}") from None
    generated = profile.workload.get("generated_tokens")
    lines = [f"profile {profile.policy} on {profile.device or 'an unnamed device'}"
             + (f": {generated} tokens generated" if generated is not None else "")]  # fmt: skip

    def latencies(kind: str, table) -> None:
        for m, s in table.items():
            lines.append(f"  {m}: {kind} " + ", ".join(f"b={b} {ms:.3f} ms" for b, ms in s.points))

    latencies("step", profile.step_ms)
    for m, row in profile.routing.items():
        n = sum(profile.counts.get(m, {}).values())
        lines.append(
            f"  {m}: " + ", ".join(f"→{t} {p:.3f}" for t, p in sorted(row.items())) + f" ({n} decisions)"
        )
    for m, share in sorted(profile.workload.get("busy_share", {}).items()):
        lines.append(f"  {m}: busy {share:.2f} of the time")
    requests = profile.workload.get("requests") or {}
    if ended := requests.get("ended"):
        for m, k in sorted((requests.get("visited") or {}).items()):
            lines.append(f"  {m}: wrote tokens of {k} of the {ended} requests that ended")
    for m, ms in sorted(profile.workload.get("gap_ms", {}).items()):
        lines.append(
            f"  {m}: {ms:.3f} ms of host time between back-to-back steps (not in the step latencies)"
        )
    for m, ms in sorted(profile.workload.get("hop_ms", {}).items()):
        lines.append(
            f"  {m}: {ms:.3f} ms of delay per hop received, beyond its own step (hops are instant in the chain)"
        )
    which = profile.workload.get("prefill_steps", "")
    for m, cost in profile.prefill.items():
        per = [f"{cost['ms_per_token']:.4f} ms per committed token"]
        if cost.get("ms_per_request") is not None:
            per.append(f"{cost['ms_per_request']:.2f} per request that ended")
        if cost.get("ms_per_visit") is not None:
            per.append(f"{cost['ms_per_visit']:.2f} per first run of a request on {m}")
        lines.append(
            f"  {m}: prompt prefills ({cost['steps']} steps, {which}) priced apart: {cost['ms']:.1f} ms beyond a "
            f"step of their batch size, " + ", ".join(per)
        )
    latencies("alone", profile.alone_ms)
    for m, sizes in profile.workload.get("merged_batches", {}).items():
        lines.append(
            f"  {m}: latencies at batch sizes {','.join(map(str, sizes))} from {profile.workload['merged_from']}"
        )
    for m, runs in profile.workload.get("merged_alone_pooled", {}).items():
        for sizes in runs:
            lines.append(
                f"  {m}: merged, alone at batch sizes {sizes[0]}-{sizes[-1]} pooled into one mean (where the two "
                "profiles meet the means fall; fitted non-decreasing again)"
            )
    if "alone_source" in profile.workload:
        measured = profile.workload.get("alone_measured", [])
        for m in profile.alone_ms:
            how = "its steps alone" if m in measured else "its step latencies"
            lines.append(f"  {m}: alone from {profile.workload['alone_source']} ({how})")
    for m, st in profile.workload.get("steps_by_state", {}).items():
        if "alone_scaled_by" in st:
            lines.append(
                f"  {m}: alone = beside × {st['alone_scaled_by']:.3f}, the ratio of its "
                f"{sum(st['alone'].values())} steps alone (too few at any one batch size)"
            )
        for sizes in st.get("alone_pooled", []):
            lines.append(
                f"  {m}: alone at batch sizes {sizes[0]}-{sizes[-1]} pooled into one mean "
                "(the means fall with the batch size there; fitted non-decreasing)"
            )
    for m, n in profile.workload.get("alone_too_few", {}).items():
        lines.append(
            f"  {m}: {n} steps alone, too few for latencies alone (min_steps {profile.workload.get('min_steps')}): "
            "tune prices every step beside"
        )
    latencies("beside", profile.beside_ms)
    for m, term in profile.colocation.items():
        fit = term.get("fit", {})
        a, b = fit.get("busy_share", [term["at_share"]] * 2)
        lines.append(
            f"  {m}: step {term['ms_per_share']:+.3f} ms per unit of {'+'.join(term['co_runners'])}'s busy share "
            f"(measured at {a:.2f}; changed by {fit.get('step_change_ms', 0.0):+.3f} ms at {b:.2f})"
        )
    lines.append(f"wrote {out}")
    return "\n".join(lines)
