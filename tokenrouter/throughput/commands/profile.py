"""`tokenrouter profile`: a profile of the plan's models, measured here (`throughput.profile`), read from a
server's metrics (`throughput.from_metrics`), or fitted from two profiles (`throughput.colocation`); written to
a file and described."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.outfile import check_output
from tokenrouter.throughput.commands.common import load_plan
from tokenrouter.throughput.commands.profile_describe import profile_output, write_and_describe
from tokenrouter.throughput.commands.profile_merge import merged, with_alone
from tokenrouter.throughput.plan_inputs import ThroughputInputError, ThroughputUsageError
from tokenrouter.throughput.profile_format import ProfileError, read_profile


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
    _check_metrics_options(from_metrics, alone, merge, keep_prefills)
    out = profile_output(plan_path, output)
    try:  # before the measurement, which a bad output path would lose
        check_output(out, [plan_path])
    except OSError as e:
        raise ThroughputInputError(f"cannot write {out}: {e}") from None
    if colocation:
        if from_metrics or since:
            raise ThroughputUsageError(
                "--colocation reads two profiles: give it without --from-metrics/--since"
            )
        return write_and_describe(_fit_colocation(plan_path, colocation), plan_path, output)
    if from_metrics:
        profile = _profile_from_metrics(plan_path, from_metrics, since, min_steps, keep_prefills)
        return write_and_describe(_completed(plan_path, profile, alone, merge), plan_path, output)
    if since:
        raise ThroughputUsageError("--since needs --from-metrics")
    settings = dict(
        batch_sizes=_batch_sizes(batch_sizes), prompts=prompts, prompt_len=prompt_len, max_tokens=max_tokens,
        repeats=repeats, warmup=warmup, seed=seed, temperature=0.0, device=device,
        prompt_texts=_prompt_texts(prompts_file) if prompts_file else [],
    )  # fmt: skip
    return write_and_describe(_measure(plan_path, settings), plan_path, output)


def _completed(plan_path: str, profile, alone: str | None, merge: str | None):
    """A served profile with the latencies alone (`--alone`) or all latencies (`--merge`) of another."""
    if alone:
        profile = with_alone(plan_path, profile, alone)
    if merge:
        profile = merged(profile, merge)
    return profile


def _check_metrics_options(
    from_metrics: str | None, alone: str | None, merge: str | None, keep_prefills: bool
):
    """The options that go with `--from-metrics` only, and not with each other."""
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


def _batch_sizes(batch_sizes: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in batch_sizes.split(",") if x.strip())
    except ValueError:
        raise ThroughputUsageError(f"bad --batch-sizes '{batch_sizes}': expected ints like 1,2,4,8") from None


def _prompt_texts(prompts_file: str) -> list[str]:
    """The prompts in the file, one a line (blank lines left out)."""
    try:
        texts = [line for line in Path(prompts_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise ThroughputInputError(f"cannot read {prompts_file}: {e}") from None
    if not texts:
        raise ThroughputInputError(f"{prompts_file} holds no prompts (one per line)")
    return texts


def _measure(plan_path: str, settings: dict):
    """The profile measured here, `settings` being `ProfileConfig`'s fields."""
    from tokenrouter.throughput.profile import ProfileConfig, ProfileRunError, run_profile

    try:
        cfg = ProfileConfig(**settings)
    except ValueError as e:
        raise ThroughputUsageError(str(e)) from None
    plan = load_plan(plan_path)
    try:
        return run_profile(plan, cfg)
    except ProfileRunError as e:
        raise ThroughputInputError(str(e)) from None


def _read_metrics(where: str) -> str:
    """A server's stats (its JSON stats at a URL, `from_metrics.read_source`) or a saved copy in a file."""
    from tokenrouter.throughput.from_metrics import MetricsProfileError, read_source

    try:
        return read_source(where)
    except MetricsProfileError as e:
        raise ThroughputInputError(str(e)) from None


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
