"""The per-model options of the throughput commands (`--batch MODEL=B`, `--hop-ms MODEL=MS`, `--gap-ms
MODEL=MS`, or `profile` for the profile's measured values), and the lines that say which were given."""

from __future__ import annotations

import math

from tokenrouter.throughput.plan_inputs import PlanSystem, ThroughputInputError, ThroughputUsageError

GAPS = "host time between back-to-back steps"


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


def parse_model_ms(values, models, measured, option: str, what: str) -> tuple[float, ...] | None:
    """`OPTION MODEL=MS …` as ms per model in the plan's order (0 for those not given), None when none is given;
    `OPTION profile`: the profile's measured values (`measured`; an input error without them)."""
    if not values:
        return None
    if "profile" in values:
        return _measured_ms(values, models, measured, option, what)
    given = parse_model_values(values, models, option, "MS", float, lambda ms: math.isfinite(ms) and ms >= 0,
                               "a time must be a finite number of ms >= 0")  # fmt: skip
    return tuple(given.get(m, 0.0) for m in models)


def _measured_ms(values, models, measured, option: str, what: str) -> tuple[float, ...]:
    """`OPTION profile`: the profile's measured values per model."""
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


def hop_line(models: tuple[str, ...], hops: tuple[float, ...]) -> str:
    return "hop delay into each model: " + ", ".join(
        f"{m} {ms:g} ms" for m, ms in zip(models, hops, strict=True)
    )
