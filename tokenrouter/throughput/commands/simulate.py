"""`tokenrouter simulate`: the plan at given thresholds in the discrete-event simulator (`throughput.simulate`),
beside the chain's prediction where the chain models the same run."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from tokenrouter.outfile import finite_json
from tokenrouter.throughput.commands.common import SystemArgs, build_system, describe_inputs, warn
from tokenrouter.throughput.commands.options import (
    gap_line,
    hop_line,
    parse_batch,
    parse_gap_ms,
    parse_hop_ms,
    unused_lines,
)
from tokenrouter.throughput.dtmc import DEFAULT_DELTA_MS, ChainError, analyze, delta_error
from tokenrouter.throughput.inputs import SystemInputs, with_step_ms
from tokenrouter.throughput.plan_inputs import (
    PlanSystem,
    ThroughputInputError,
    ThroughputUsageError,
    concentration_warnings,
)
from tokenrouter.throughput.rate_tune import beyond_shares, beyond_warnings, measured_sizes
from tokenrouter.throughput.sim_config import SimConfig, SimResult, steps_error
from tokenrouter.throughput.simulate import simulate


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
        inp = _replayed_requests(requests, inp, cfg_kw)
    _add_delays(cfg_kw, inp, system)
    thresholds = _thresholds(batch, inp, plan)
    cfg = _config(inp, system, thresholds, cfg_kw)
    sim = simulate(inp, cfg)
    pred = _chain_prediction(inp, cfg, delta_ms) if chain else None
    if as_json:
        return _as_json(sim, pred, inp.models)
    run = _Run(plan, system, inp, cfg, thresholds, sim, requests, arrivals)
    return "\n".join(_header(run) + _chain_lines(run, pred, delta_ms) + _result_lines(run))


def _as_json(sim: SimResult, pred, models: tuple[str, ...]) -> str:
    """The simulation's result, and the chain's (or why it failed) where it was asked for."""
    out = {"simulation": sim.as_dict(models)}
    if pred is not None:
        out["chain"] = pred if isinstance(pred, str) else pred.as_dict(models)
    return json.dumps(finite_json(out), indent=2)


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


def _replayed_requests(path: str, inp: SystemInputs, cfg_kw: dict) -> SystemInputs:
    """`simulate --requests REPORT`: each request's own routing (and length) into `cfg_kw`; the inputs with the
    report's prefill costs per visit."""
    from tokenrouter.throughput.workload import (
        WorkloadError,
        read_requests,
        request_lengths,
        request_routing,
        with_visit_costs,
    )

    try:
        per_request, output_len = read_requests(path)
        cfg_kw["requests"] = tuple(request_routing(inp, per_request))
        inp = with_visit_costs(inp, per_request)
        lengths = request_lengths(per_request)
    except WorkloadError as e:
        raise ThroughputInputError(str(e)) from None
    if cfg_kw.get("request_tokens") is None:
        _report_lengths(path, cfg_kw, output_len, lengths)
    return inp


def _report_lengths(path: str, cfg_kw: dict, output_len: int | None, lengths: tuple[int, ...] | None) -> None:
    """Without --request-tokens: the report's output_len into `cfg_kw`, and each request's own length where
    they differ."""
    if output_len is None:
        raise ThroughputUsageError(f"{path} has no spec.output_len: give --request-tokens")
    cfg_kw["request_tokens"] = output_len
    # each request as long as it ran (a .jsonl load's own lengths, or ends at EOS); --request-tokens
    # gives every request that many instead
    if lengths is not None and set(lengths) != {output_len}:
        cfg_kw["request_lengths"] = lengths


def _add_delays(cfg_kw: dict, inp: SystemInputs, system: PlanSystem) -> None:
    """`--hop-ms` and `--gap-ms` items as ms per model, in `cfg_kw` where given."""
    hop_ms = parse_hop_ms(cfg_kw.pop("hop_ms", None), inp.models, system.hop_ms)
    if hop_ms is not None:
        cfg_kw["hop_ms"] = hop_ms
    gap_ms = parse_gap_ms(cfg_kw.pop("gap_ms", None), inp.models, system.gap_ms)
    if gap_ms is not None:
        cfg_kw["gap_ms"] = gap_ms


def _thresholds(batch: list[str] | None, inp: SystemInputs, plan: dict) -> dict[str, int]:
    """Each model's threshold, from `--batch` or the plan; an input error where neither gives one or delayed
    batching could deadlock."""
    from tokenrouter.compiler.passes.check_feasibility import feasibility_error

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
    return thresholds


def _config(inp: SystemInputs, system: PlanSystem, thresholds: dict[str, int], cfg_kw: dict) -> SimConfig:
    b = tuple(thresholds[m] for m in inp.models)
    # alike requests, as the chain's (a replay of a benchmark's requests has each request's own routing)
    if cfg_kw.get("requests") is None:
        warn(concentration_warnings(system, b))
    try:
        cfg = SimConfig(b, **cfg_kw)
    except ValueError as e:
        raise ThroughputUsageError(str(e)) from None
    if error := steps_error(inp, cfg):
        raise ThroughputUsageError(error)
    return cfg


def _chain_prediction(inp: SystemInputs, cfg: SimConfig, delta_ms: float):
    """The chain's result for the same run, its error message where it fails, or None where the run has what
    the chain does not model (requests that end, a timeout, hop delays)."""
    if cfg.request_tokens is not None or cfg.max_delay_ms is not None or cfg.hop_ms is not None:
        return None
    try:  # the chain takes the host gaps as longer steps (`tune --gap-ms`)
        return analyze(inp if cfg.gap_ms is None else with_step_ms(inp, cfg.gap_ms), cfg.thresholds, delta_ms)
    except ChainError as e:
        return str(e)


@dataclass(slots=True)
class _Run:
    """What the text report describes."""

    plan: dict
    system: PlanSystem
    inp: SystemInputs
    cfg: SimConfig
    thresholds: dict[str, int]
    sim: SimResult
    requests: str | None
    arrivals: str | None


def _span(run: _Run) -> str:
    """What was simulated: a horizon after a warm-up, an open loop's replayed arrivals, or a finite run."""
    cfg, sim = run.cfg, run.sim
    if cfg.requests is not None:
        return (
            f"a finite run of {len(cfg.requests)} requests from {run.requests} ("
            + (
                f"{min(cfg.request_lengths)}-{max(cfg.request_lengths)} tokens, each its own length and routing"
                if cfg.request_lengths
                else f"{cfg.request_tokens} tokens each, each request's own routing"
            )
            + f") to the last one's end: {sim.time_ms / 1000:.3f} s"
        )
    if cfg.arrivals_ms is not None:  # (an arrival rate or arrival times, not both)
        return (
            f"an open loop of {run.arrivals}'s {len(cfg.arrivals_ms)} arrivals, at most N in flight, to the last "
            f"request's end: {sim.time_ms / 1000:.3f} s"
        )
    span = f"{cfg.horizon_ms / 1000:g} s simulated after {cfg.warmup_ms / 1000:g} s warm-up"
    if cfg.arrival_rate_per_s is not None:
        span += f", an open loop of {cfg.arrival_rate_per_s:g} requests/s (Poisson), at most N in flight"
    return span


def _header(run: _Run) -> list[str]:
    cfg, inp = run.cfg, run.inp
    lines = [
        f"simulate {run.plan['policy']['name']}: N = {inp.concurrency}, B = "
        + ", ".join(f"{m} {x}" for m, x in run.thresholds.items())
        + f", {_span(run)}, seed {cfg.seed}",
        *describe_inputs(run.system),
    ]
    if cfg.hop_ms is not None:
        lines.append(hop_line(inp.models, cfg.hop_ms) + " (the chain takes hops as instant: not shown)")
    if cfg.gap_ms is not None:
        lines.append(gap_line(inp.models, cfg.gap_ms))
    lines += unused_lines(run.system, cfg.hop_ms, cfg.gap_ms)
    lines.append(
        f"throughput: {run.sim.throughput:.2f} tok/s"
        + (" (STALLED: every model idle, no queue at its threshold)" if run.sim.stalled else "")
    )
    return lines


def _chain_lines(run: _Run, pred, delta_ms: float) -> list[str]:
    """The chain's throughput beside the simulation's."""
    lines = []
    if pred is not None and run.inp.prefill and any(run.inp.prefill):
        lines.append(
            "note: the chain spreads the prompt prefill costs over every step; requests that never end (no "
            "--request-tokens) prefill only in the warm-up here"
        )
    if isinstance(pred, str):
        lines.append(f"chain: not evaluated: {pred}")
    elif pred is not None:
        diff = (run.sim.throughput - pred.throughput) / pred.throughput * 100
        lines.append(f"chain (δ = {delta_ms:g} ms): {pred.throughput:.2f} tok/s (simulation {diff:+.2f}%)")
    return lines


def _result_lines(run: _Run) -> list[str]:
    """Each model's figures, the requests' latencies, and the warnings about the run."""
    cfg, sim, inp = run.cfg, run.sim, run.inp
    lines = [
        f"  {m}: utilization {sim.utilization[i]:.3f}, mean batch {sim.mean_batch[i]:.2f}, "
        f"mean queue {sim.mean_queue[i]:.2f}, {sim.steps_per_s[i]:.1f} steps/s"
        for i, m in enumerate(inp.models)
    ]
    if cfg.request_tokens is not None:
        lines.append(f"finished requests: {sim.finished_requests}")
    if sim.latency is not None:
        lines += _latency_lines(sim.latency)
    limits = measured_sizes(inp, run.system.profiled())
    lines += [
        f"warning: {x}"
        for x in beyond_warnings(inp.models, beyond_shares(sim.steps_by_batch, limits), limits)
    ]
    if cfg.requests is not None and sim.finished_requests < len(cfg.requests):
        lines.append(
            f"warning: the run was cut at --horizon-ms {cfg.horizon_ms:g} before its last request ended: "
            "raise it for the whole run"
        )
    return lines


def _latency_lines(lat: dict) -> list[str]:
    lines = [f"requests measured (arrived after the warm-up, ended in the horizon): {lat['measured']}"] + [
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
    return lines
