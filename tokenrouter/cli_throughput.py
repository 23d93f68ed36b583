"""The throughput model's commands of `tokenrouter` (`tune`, `simulate`, `profile`): their options, declared here
and registered by `cli.py`; the work is `tokenrouter.throughput`'s (`commands.py`, `tune_command.py`)."""

from __future__ import annotations

import typer

from tokenrouter.cli_support import user_errors


def throughput_errors():
    """The throughput model's user errors: a malformed value exits 2, missing or inconsistent inputs 1."""
    from tokenrouter.throughput.plan_inputs import ThroughputInputError, ThroughputUsageError

    return user_errors((ThroughputUsageError, 2), (ThroughputInputError, 1))


def tune(
    plan: str = typer.Argument(..., help="Plan file (.plan) or policy source (.tr)."),
    concurrency: int = typer.Option(
        None, "--concurrency", "-n", help="N concurrent requests (default: the plan's)."
    ),
    step_ms: list[str] = typer.Option(
        None, "--step-ms", help="MODEL=MS or MODEL=B:MS,B:MS,… (step latency)."
    ),
    p: list[str] = typer.Option(None, "--p", help="FROM:TO=PROB routing probability per step."),
    delta_ms: float = typer.Option(0.1, "--delta-ms", help="Time step δ of the chain, ms."),
    profile: str = typer.Option(None, "--profile", help="Profile JSON from `tokenrouter profile`."),
    json_out: bool = typer.Option(False, "--json", help="Print the tuning record as JSON."),
    output: str = typer.Option(
        None, "-o", "--output", help="Plan to write (default: the input plan, or FILE.plan)."
    ),
    plot: str = typer.Option(None, "--plot", help="Write a PNG of T(B) over the candidates."),
    top: int = typer.Option(10, "--top", help="Show this many candidates."),
    max_states: int = typer.Option(250_000, "--max-states", help="Skip candidates whose chain is larger."),
    request_tokens: int = typer.Option(
        None,
        "--request-tokens",
        help="Tokens each request of the load commits: prices the profile's prompt prefills per request "
        "(default: as the profile's own load had them); with --request-rate, the length of each request.",
    ),
    request_rate: float = typer.Option(
        None,
        "--request-rate",
        help="Tune for latency at this offered load (requests/s, Poisson, at most -n in flight) by simulating "
        "each candidate's open loop, instead of the chain's closed-loop throughput; needs --request-tokens.",
    ),
    objective: str = typer.Option(
        None,
        "--objective",
        help="With --request-rate: the latency to minimize, e.g. from-arrival-p99 (default), "
        "from-arrival-p50, tpot-p50, ttft-p99, e2e-mean.",
    ),
    max_delay_ms: float = typer.Option(
        None, "--max-delay-ms", help="With --request-rate: the batching timeout (default: the plan's)."
    ),
    hop_ms: list[str] = typer.Option(
        None,
        "--hop-ms",
        help="With --request-rate: MODEL=MS, a hop's transit into MODEL (default instant); `profile`: the "
        "profile's measured delays.",
    ),
    gap_ms: list[str] = typer.Option(
        None,
        "--gap-ms",
        help="MODEL=MS, host time each step of MODEL takes beyond its latency, added to its steps in the chain "
        "(or the simulator, with --request-rate; default none); `profile`: the gaps between back-to-back steps "
        "that the profile measured.",
    ),
    horizon_ms: float = typer.Option(
        None,
        "--horizon-ms",
        help="With --request-rate: simulated time of the final round (default 300000; the "
        "first round simulates a fifth of it).",
    ),
    seeds: int = typer.Option(
        None, "--seeds", help="With --request-rate: seeds of the final round (default 3)."
    ),
    keep: int = typer.Option(
        None, "--keep", help="With --request-rate: candidates in the final round (default 5)."
    ),
    jobs: int = typer.Option(
        None, "--jobs", help="With --request-rate: processes to simulate in (default: the CPUs, up to 8)."
    ),
    tune_delay: bool = typer.Option(
        False,
        "--tune-delay",
        help="Choose serve.max_delay_ms too: the chain's best thresholds and the plan's setting are simulated at "
        "the plan's timeout and at 2-16 times it (up to 200 ms); a longer timeout is kept only where it serves "
        "more than 1 % more.",
    ),
) -> None:
    """Choose delayed-batching thresholds B* with the DTMC throughput model (or, with --request-rate, for the
    lowest latency at that load in the simulator); write them into the plan."""
    from tokenrouter.throughput.commands import SystemArgs
    from tokenrouter.throughput.tune_command import tune_command

    args = SystemArgs(plan, concurrency, step_ms, p, profile, request_tokens)
    rate_only = {"--objective": objective, "--max-delay-ms": max_delay_ms, "--hop-ms": hop_ms,
                 "--horizon-ms": horizon_ms, "--seeds": seeds, "--keep": keep, "--jobs": jobs}  # fmt: skip
    with throughput_errors():
        text = tune_command(args, request_rate, rate_only, delta_ms=delta_ms, output=output, json_out=json_out,
                            plot=plot, top=top, max_states=max_states, gap_ms=gap_ms, tune_delay=tune_delay)  # fmt: skip
    typer.echo(text)


def simulate(
    plan: str = typer.Argument(..., help="Plan file (.plan) or policy source (.tr)."),
    concurrency: int = typer.Option(
        None, "--concurrency", "-n", help="N concurrent requests (default: the plan's)."
    ),
    step_ms: list[str] = typer.Option(
        None, "--step-ms", help="MODEL=MS or MODEL=B:MS,B:MS,… (step latency)."
    ),
    p: list[str] = typer.Option(None, "--p", help="FROM:TO=PROB routing probability per step."),
    profile: str = typer.Option(None, "--profile", help="Profile JSON from `tokenrouter profile`."),
    batch: list[str] = typer.Option(None, "--batch", help="MODEL=B threshold (default: the plan's)."),
    horizon_ms: float = typer.Option(60_000.0, "--horizon-ms", help="Simulated time measured, ms."),
    warmup_ms: float = typer.Option(2_000.0, "--warmup-ms", help="Simulated time discarded first, ms."),
    seed: int = typer.Option(0, "--seed"),
    request_tokens: int = typer.Option(
        None,
        "--request-tokens",
        help="Tokens per request (default: endless); also prices the profile's prompt prefills per request.",
    ),
    think_ms: float = typer.Option(
        0.0, "--think-ms", help="Mean think time before a finished request returns."
    ),
    burstiness: float = typer.Option(
        1.0, "--burstiness", help="Squared CV of think times (1 = exponential)."
    ),
    max_delay_ms: float = typer.Option(
        None,
        "--max-delay-ms",
        help="Start a waiting queue after this long (default: no timeout, as the chain; the server starts one "
        "after the plan's serve.max_delay_ms, which this option reproduces).",
    ),
    hop_ms: list[str] = typer.Option(
        None,
        "--hop-ms",
        help="MODEL=MS: a hop reaches MODEL this long after the sender's step ends (instant by default; "
        "served runs measure it: tokenrouter_hop_delay_seconds_total); `profile`: the profile's measured delays "
        "(workload.hop_ms).",
    ),
    gap_ms: list[str] = typer.Option(
        None,
        "--gap-ms",
        help="MODEL=MS: host time each step of MODEL takes beyond its latency (none by default; served runs measure "
        "the gap between back-to-back steps: tokenrouter_step_gap_seconds_total); `profile`: the profile's "
        "(workload.gap_ms).",
    ),
    delta_ms: float = typer.Option(0.1, "--delta-ms", help="δ of the chain shown for comparison, ms."),
    no_chain: bool = typer.Option(False, "--no-chain", help="Do not compute the chain's prediction."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    requests: str = typer.Option(
        None,
        "--requests",
        help="A `tokenrouter bench --json` report: replay its requests, each with its own routing, as a "
        "finite run (two-model plans).",
    ),
    request_rate: float = typer.Option(
        None,
        "--request-rate",
        help="An open loop: requests arrive at R per second (Poisson), at most -n in flight, each of "
        "--request-tokens; adds each request's latencies (as `tokenrouter bench --request-rate` measures them).",
    ),
    arrivals: str = typer.Option(
        None,
        "--arrivals",
        help="A `tokenrouter bench --request-rate --json` report: an open loop on its requests' arrival times "
        "(every request measured, to the last one's end; -n and --request-tokens default to the report's), to "
        "set side by side with what that run measured.",
    ),
) -> None:
    """Discrete-event simulation of the plan's system (a closed loop of N requests, or an open loop with
    --request-rate): throughput, utilization, queueing, and an open loop's latencies."""
    from tokenrouter.throughput.commands import SystemArgs, run_simulate

    args = SystemArgs(plan, concurrency, step_ms, p, profile, request_tokens)
    cfg = {"horizon_ms": horizon_ms, "warmup_ms": warmup_ms, "seed": seed, "request_tokens": request_tokens,
           "think_ms": think_ms, "burstiness": burstiness, "max_delay_ms": max_delay_ms, "hop_ms": hop_ms,
           "gap_ms": gap_ms, "arrival_rate_per_s": request_rate}  # fmt: skip
    with throughput_errors():
        text = run_simulate(args, batch, cfg, json_out, not no_chain, delta_ms, requests, arrivals)
    typer.echo(text)


def profile(
    plan: str = typer.Argument(..., help="Plan file (.plan) or policy source (.tr)."),
    output: str = typer.Option(
        None, "-o", "--output", help="Profile JSON to write (default: PLAN.profile.json)."
    ),
    batch_sizes: str = typer.Option("1,2,4,8", "--batch-sizes", help="Batch sizes to time, e.g. 1,2,4,8."),
    prompts: int = typer.Option(8, "--prompts", help="Sample requests for the routing counts."),
    prompt_len: int = typer.Option(
        16, "--prompt-len", help="Tokens per random prompt (and per timed prefill)."
    ),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Tokens generated per sample request."),
    prompts_file: str = typer.Option(
        None, "--prompts-file", help="Text prompts, one per line (else random ids)."
    ),
    device: str = typer.Option(
        None, "--device", help="Run every model here (default: as `serve` places them)."
    ),
    repeats: int = typer.Option(5, "--repeats", help="Timed steps per batch size (the median is kept)."),
    warmup: int = typer.Option(2, "--warmup", help="Untimed steps first."),
    seed: int = typer.Option(0, "--seed"),
    from_metrics: str = typer.Option(
        None,
        "--from-metrics",
        help="Instead of timing each model alone: read L_i(b) and p_ij from a running server's stats "
        "(URL: its /v1/stats; URL/metrics: its Prometheus text) or a saved copy (FILE), as the models ran side by "
        "side (serve it with --mode eager).",
    ),
    since: str = typer.Option(
        None, "--since", help="With --from-metrics: an earlier scrape (URL or FILE) to subtract."
    ),
    min_steps: int = typer.Option(
        5, "--min-steps", help="With --from-metrics: keep batch sizes seen this often."
    ),
    colocation: list[str] = typer.Option(
        None,
        "--colocation",
        help="Give twice: two --from-metrics profiles of models sharing a GPU, served at different thresholds "
        "(eager, then e.g. `serve --batch llm=3`). Writes the first with a co-location term for `tune`: how "
        "each model's step grows with its co-runners' busy share.",
    ),
    alone: str = typer.Option(
        None,
        "--alone",
        help="With --from-metrics: another profile whose latencies alone (its busy board's, else its step "
        "latencies) `tune` uses for the steps a model sharing a GPU starts while the others are idle (the served "
        "ones apply while one runs), e.g. one served at (2, 5), whose small model ran alone at every batch size. "
        "Not `tokenrouter profile PLAN`'s timings of each model on its own: on the CPU they came out 2.4x below "
        "the served steps (docs/tuning.md).",
    ),
    merge: str = typer.Option(
        None,
        "--merge",
        help="With --from-metrics: another --from-metrics profile, of the plan served at the thresholds delayed "
        "batching would use (e.g. `serve --batch slm=2 --batch llm=5`), whose latencies (every step's, alone and "
        "beside) replace this one's at the batch sizes it measured; this one's routing and other batch sizes stay.",
    ),
    keep_prefills: bool = typer.Option(
        False,
        "--keep-prefills",
        help="With --from-metrics: leave the prefill steps (those that ran a request's first tokens; in metrics of "
        "layout 1 without those counters, those whose longest row ran more than 64 new tokens) in their batch sizes' "
        "latencies instead of pricing them apart per request.",
    ),
) -> None:
    """Measure the plan's step latencies L_i(b) and routing probabilities p_ij into a profile for `tune`."""
    from tokenrouter.throughput.commands import run_profile_command

    with throughput_errors():
        text = run_profile_command(plan, output, batch_sizes, prompts, prompt_len, max_tokens, prompts_file, device,
                                   repeats, warmup, seed, from_metrics, since, min_steps, list(colocation or []),
                                   alone, merge, keep_prefills)  # fmt: skip
    typer.echo(text)
