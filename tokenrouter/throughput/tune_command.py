"""`tokenrouter tune`'s choice between its two tunings: the chain's closed-loop throughput (`run_tune`), or with
`--request-rate` the simulator's latency at that load (`run_rate_tune`); the options of the one given to the
other are a usage error (`ThroughputUsageError`)."""

from __future__ import annotations

from tokenrouter.throughput.commands import SystemArgs, run_rate_tune, run_tune
from tokenrouter.throughput.plan_inputs import ThroughputUsageError

DEFAULT_HORIZON_MS = 300_000.0


def tune_command(args: SystemArgs, request_rate: float | None, rate_only: dict, *, delta_ms: float,
                 output: str | None, json_out: bool, plot: str | None, top: int, max_states: int,
                 gap_ms: list[str] | None, tune_delay: bool = False) -> str:  # fmt: skip
    """The text `tune` prints. `rate_only`: the --request-rate options by flag (None or [] when not given):
    --objective, --max-delay-ms, --hop-ms, --horizon-ms, --seeds, --keep, --jobs."""
    if request_rate is None:
        if given := [flag for flag, value in rate_only.items() if value not in (None, [])]:
            raise ThroughputUsageError(
                f"{', '.join(given)} need{'s' if len(given) == 1 else ''} --request-rate (tuning for latency at a load)"
            )
        return run_tune(args, delta_ms, output, json_out, plot, top, max_states, gap_ms=gap_ms,
                        tune_delay=tune_delay)[0]  # fmt: skip
    if tune_delay:
        raise ThroughputUsageError("--tune-delay goes with the closed-loop tuning; with --request-rate, give the "
                                   "timeout as --max-delay-ms")  # fmt: skip
    if plot:
        raise ThroughputUsageError("--plot charts the chain's T(B); it does not go with --request-rate")
    return run_rate_tune(args, _rate(request_rate, rate_only, gap_ms), output, json_out, top)[0]


def _rate(request_rate: float, given: dict, gap_ms: list[str] | None) -> dict:
    """`run_rate_tune`'s settings, the defaults filled in."""
    horizon_ms = given["--horizon-ms"] or DEFAULT_HORIZON_MS
    return {
        "rate_per_s": request_rate,
        "objective": given["--objective"] or "from-arrival-p99",
        "max_delay_ms": given["--max-delay-ms"],
        "hop_ms": given["--hop-ms"],
        "gap_ms": gap_ms,
        "horizon_ms": horizon_ms,
        "screen_ms": horizon_ms / 5,
        "seeds": 3 if given["--seeds"] is None else given["--seeds"],
        "keep": 5 if given["--keep"] is None else given["--keep"],
        "jobs": given["--jobs"],
    }
