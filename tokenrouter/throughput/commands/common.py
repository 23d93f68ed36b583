"""What the throughput commands share: the plan and the system it describes, the lines that describe the
inputs, the checks of output files."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tokenrouter.throughput.plan_inputs import (
    PlanSystem,
    ThroughputInputError,
    ThroughputUsageError,
    parse_p,
    parse_step_ms,
    system_from_plan,
)
from tokenrouter.throughput.profile_format import ProfileError, read_profile


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
    warn(system.warnings)
    return plan, system


def warn(lines: list[str]) -> None:
    """Each line as a warning on stderr."""
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)


def describe_inputs(system: PlanSystem) -> list[str]:
    """The step latencies and routing the model was given, each with where it came from, and the prompt
    prefill costs priced apart."""
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
    return [f"step latency: {steps}", "routing: " + "; ".join(probs), *_prefill_lines(system)]


def _prefill_lines(system: PlanSystem) -> list[str]:
    inp = system.inputs
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
    if not costs:
        return []
    return [
        "prompt prefill, apart from the step latency: " + "; ".join(costs) + f" (profile; priced for "
        f"{system.prefill_for})"
    ]


def format_rows(head: list[str], rows: list[list[str]]) -> list[str]:
    """A table's lines, each column as wide as its widest cell."""
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    return ["  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)) for line in [head, *rows]]


def write_tuned(tuned: dict, args: SystemArgs, output: str | None, write: bool) -> Path:
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
