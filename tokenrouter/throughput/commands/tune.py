"""`tokenrouter tune`: the thresholds with the highest throughput the chain predicts, written into the plan."""

from __future__ import annotations

import json
import math

from tokenrouter.outfile import finite_json
from tokenrouter.throughput.commands.common import (
    SystemArgs,
    build_system,
    check_plot_path,
    describe_inputs,
    format_rows,
    warn,
    write_tuned,
)
from tokenrouter.throughput.commands.options import GAPS, gap_line, parse_gap_ms, unused_note
from tokenrouter.throughput.dtmc import DEFAULT_DELTA_MS, DEFAULT_MAX_STATES, delta_error, with_transit
from tokenrouter.throughput.inputs import SystemInputs, with_step_ms
from tokenrouter.throughput.optimize import TuneError, TuneResult, tune
from tokenrouter.throughput.plan_inputs import (
    PlanSystem,
    ThroughputInputError,
    ThroughputUsageError,
    concentration_warnings,
)
from tokenrouter.throughput.timeout_check import (
    SEARCH_CANDIDATES,
    TimeoutSearch,
    check_timeout,
    current_thresholds,
    search_timeouts,
)
from tokenrouter.throughput.tuned_plan import apply_tuning, beyond_profile_warnings, timeout_warnings


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
    tune_delay: bool = False,
) -> tuple[str, dict]:
    """Returns (text to print, the tuned plan). Raises ThroughputInputError for the user's mistakes. `gap_ms`:
    `MODEL=MS` items (or `profile`), host time each step of a model takes beyond its latency, which the chain
    adds to every step of it (`inputs.with_step_ms`). `tune_delay`: choose the plan's `max_delay_ms` too, among
    the chain's best thresholds simulated at longer timeouts (`timeout_check.search_timeouts`)."""
    _check_options(delta_ms, top, max_states, plot)
    plan, system = build_system(args)
    gaps = parse_gap_ms(gap_ms, system.inputs.models, system.gap_ms)
    chain_inputs = system.inputs if gaps is None else with_step_ms(system.inputs, gaps)
    result = _tune(chain_inputs, system, delta_ms, max_states)
    search = _search_delay(plan, chain_inputs, result, args.request_tokens) if tune_delay else None
    if search is not None:
        late, check = _delay_warnings(plan, system, result, search), None
    else:
        late, check = _warnings(plan, system, chain_inputs, result, args.request_tokens)
    warn(late)
    tuned = apply_tuning(plan, system, result, top=top, warnings=late, gap_ms=gaps)
    if search is not None:
        tuned["serve"]["max_delay_ms"] = search.delay_ms
        tuned["tuning"]["timeout_search"] = search.as_dict()
    if check is not None:
        tuned["tuning"]["timeout_check"] = check.as_dict()
    out_path = write_tuned(tuned, args, output, write)
    if plot:
        _plot(result, plan, plot)
    if as_json:
        payload = {"plan": str(out_path) if write else None, "tuning": tuned["tuning"], "plot": plot}
        return json.dumps(finite_json(payload), indent=2), tuned
    lines = _header(plan, system, result, gaps) + [format_table(result, top)]
    lines += _choice(plan, system, result, chain_inputs, search)
    if write:
        lines.append(f"wrote {out_path} (batch for {', '.join(system.auto) or 'no auto model'})")
    if plot:
        lines.append(f"wrote {plot}")
    return "\n".join(lines), tuned


def _check_options(delta_ms: float, top: int, max_states: int, plot: str | None) -> None:
    """The options' values, before any work."""
    if not (math.isfinite(delta_ms) and delta_ms > 0):
        raise ThroughputUsageError(f"--delta-ms must be a finite number of ms > 0, got {delta_ms}")
    if top < 1:
        raise ThroughputUsageError(f"--top must be >= 1, got {top}")
    if max_states < 1:
        raise ThroughputUsageError(f"--max-states must be >= 1, got {max_states}")
    if plot:
        check_plot_path(plot)


def _tune(chain_inputs: SystemInputs, system: PlanSystem, delta_ms: float, max_states: int) -> TuneResult:
    """The chain's search, refused where no candidate serves a token."""
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
    return result


def _warnings(
    plan: dict, system: PlanSystem, chain_inputs: SystemInputs, result: TuneResult, request_tokens: int | None
):
    """The warnings about B* and the timeout check (None where the plan's timeout does not matter); where the
    check finds the plan's setting serves better, the result chooses it."""
    late = timeout_warnings(plan, system.inputs.models, result.best)
    check = check_timeout(plan, chain_inputs, result.best.thresholds, request_tokens) if late else None
    if check is not None:
        late.append(check.line())
        if check.keep_current:
            _keep_current(result, check)
            late = [*timeout_warnings(plan, system.inputs.models, result.best), check.line()]
    return late + _choice_warnings(system, result), check


def _choice_warnings(system: PlanSystem, result: TuneResult) -> list[str]:
    """The warnings about the chosen thresholds whatever the timeout: beyond the profile, too concentrated."""
    return beyond_profile_warnings(system.inputs, result.best) + concentration_warnings(
        system, result.best.thresholds
    )


def _search_delay(
    plan: dict, chain_inputs: SystemInputs, result: TuneResult, request_tokens: int | None
) -> TimeoutSearch:
    """`--tune-delay`: the chain's best `SEARCH_CANDIDATES` thresholds and the plan's own setting (where the
    chain evaluated it) simulated at timeouts from the plan's up; the result chooses the thresholds found."""
    ranked = [r.thresholds for r in result.results if r.throughput > 0]
    current = current_thresholds(plan, chain_inputs.models)
    candidates = ranked[:SEARCH_CANDIDATES] + ([current] if current in ranked[SEARCH_CANDIDATES:] else [])
    try:
        search = search_timeouts(plan, chain_inputs, candidates, request_tokens)
    except ValueError as e:
        raise ThroughputInputError(f"--tune-delay: {e}") from None
    result.chosen = [r.thresholds for r in result.results].index(search.best)
    return search


def _delay_warnings(plan: dict, system: PlanSystem, result: TuneResult, search: TimeoutSearch) -> list[str]:
    """The warnings about the thresholds and timeout `--tune-delay` chose, with the search's line."""
    chosen = {**plan, "serve": {**plan.get("serve", {}), "max_delay_ms": search.delay_ms}}
    return [*timeout_warnings(chosen, system.inputs.models, result.best), search.line()] + _choice_warnings(
        system, result
    )


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


def _plot(result: TuneResult, plan: dict, plot: str) -> None:
    from tokenrouter.throughput.plot import plot_tuning

    try:
        plot_tuning(result, plot, title=f"{plan['policy']['name']}: T(B) at N = {result.concurrency}")
    except OSError as e:
        raise ThroughputInputError(f"cannot write {plot}: {e}") from None


def _header(plan: dict, system: PlanSystem, result: TuneResult, gaps) -> list[str]:
    """The search, its inputs, and what it was given beside them."""
    lines = [
        f"tune {plan['policy']['name']}: N = {result.concurrency}, δ = {result.delta_ms:g} ms, {result.method} "
        f"search: {len(result.results)} of {result.n_feasible} feasible candidates evaluated in {result.seconds:.2f} s"
    ]
    if result.sampling:
        from tokenrouter.throughput.large_n import describe

        lines.append(describe(result))
    lines += describe_inputs(system)
    if gaps is not None:
        lines.append(gap_line(system.inputs.models, gaps) + " (added to every step in the chain)")
    lines += unused_note(GAPS, "--gap-ms profile", system.gap_ms, gaps, "the chain")
    if system.fixed:
        lines.append("fixed: " + ", ".join(f"{m} {b}" for m, b in system.fixed.items()))
    return lines


def format_table(result: TuneResult, top: int) -> str:
    """The best `top` candidates. A sampled search's rows after its finalists are "race" rows: their figures
    come from the race's shorter paths, which price steps without the prompt prefills and co-location terms that
    the finalists' include, so they rank below the finalists whatever their T."""
    models = result.models
    finalists = result.sampling["finalists"] if result.sampling else len(result.results)

    def kind(k: int, r) -> str:
        return str(r.n_states) if not r.sampled_epochs else "sampled" if k < finalists else "race"

    head = ["rank", "B (" + ",".join(models) + ")", "T tok/s", "states"] + [f"util {m}" for m in models]
    rows = [
        [
            str(k + 1),
            ",".join(map(str, r.thresholds)),
            f"{r.throughput:.2f}" + (f" ±{r.stderr_tok_s:.2f}" if r.sampled_epochs else ""),
            kind(k, r),
        ]
        + [f"{u:.2f}" for u in r.utilization]
        for k, r in enumerate(result.results[:top])
    ]
    lines = format_rows(head, rows)
    if any(row[3] == "race" for row in rows):
        lines.append("race: the candidate's figure from the race (a shorter path, its steps priced without the "
                     "prompt prefills and co-location terms that the finalists' figures include): ranked after them")  # fmt: skip
    return "\n".join(lines)


def _choice(
    plan: dict,
    system: PlanSystem,
    result: TuneResult,
    chain_inputs: SystemInputs,
    search: TimeoutSearch | None,
) -> list[str]:
    """The candidates not evaluated, B* (or the plan's setting kept, or what `--tune-delay` chose), and B*'s
    throughput with the hops' transit."""
    current = current_thresholds(plan, system.inputs.models)
    lines = []
    for b, msg in result.failed.items():
        mine = " (the plan's setting)" if b == current else ""
        lines.append(f"not evaluated: B = {','.join(map(str, b))}{mine}: {msg}")
    best = result.best
    chosen = ", ".join(f"{m} {b}" for m, b in result.best_thresholds().items())
    if search is not None:
        lines.append(f"chosen: {chosen} with max_delay_ms = {search.delay_ms:g} (simulated {search.best_tok_s:.1f} "
                     f"tok/s; the chain, without a timeout: T = {best.throughput:.2f})")  # fmt: skip
    else:
        lines.append(
            ("B* = " if result.chosen == 0 else "kept the plan's setting over the chain's B* (the timeout): ")
            + chosen
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
    return lines
