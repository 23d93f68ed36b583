"""A profile written to its file, and the lines that describe it: its latencies, routing, what the served
workload showed, and where each part came from."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.throughput.plan_inputs import ThroughputInputError


def profile_output(plan_path: str, output: str | None) -> Path:
    return Path(output) if output else Path(plan_path).with_suffix(".profile.json")


def write_and_describe(profile, plan_path: str, output: str | None) -> str:
    from tokenrouter.throughput.profile_format import write_profile

    out = profile_output(plan_path, output)
    try:
        write_profile(profile, out, inputs=[plan_path])
    except OSError as e:
        raise ThroughputInputError(f"cannot write {out}: {e}") from None
    generated = profile.workload.get("generated_tokens")
    lines = [f"profile {profile.policy} on {profile.device or 'an unnamed device'}"
             + (f": {generated} tokens generated" if generated is not None else "")]  # fmt: skip
    lines += _latencies("step", profile.step_ms) + _routing(profile) + _served(profile) + _prefills(profile)
    lines += _latencies("alone", profile.alone_ms) + _merged(profile) + _alone(profile)
    lines += _latencies("beside", profile.beside_ms) + _colocation(profile)
    lines.append(f"wrote {out}")
    return "\n".join(lines)


def _latencies(kind: str, table) -> list[str]:
    return [
        f"  {m}: {kind} " + ", ".join(f"b={b} {ms:.3f} ms" for b, ms in s.points) for m, s in table.items()
    ]


def _routing(profile) -> list[str]:
    return [
        f"  {m}: "
        + ", ".join(f"→{t} {p:.3f}" for t, p in sorted(row.items()))
        + f" ({sum(profile.counts.get(m, {}).values())} decisions)"
        for m, row in profile.routing.items()
    ]


def _served(profile) -> list[str]:
    """What a served run showed: each model's busy share, the requests it wrote in, its host gaps and hop
    delays."""
    workload = profile.workload
    lines = [
        f"  {m}: busy {share:.2f} of the time" for m, share in sorted(workload.get("busy_share", {}).items())
    ]
    requests = workload.get("requests") or {}
    if ended := requests.get("ended"):
        for m, k in sorted((requests.get("visited") or {}).items()):
            lines.append(f"  {m}: wrote tokens of {k} of the {ended} requests that ended")
    for m, ms in sorted(workload.get("gap_ms", {}).items()):
        lines.append(
            f"  {m}: {ms:.3f} ms of host time between back-to-back steps (not in the step latencies)"
        )
    for m, ms in sorted(workload.get("hop_ms", {}).items()):
        lines.append(
            f"  {m}: {ms:.3f} ms of delay per hop received, beyond its own step (hops are instant in the chain)"
        )
    return lines


def _prefills(profile) -> list[str]:
    which = profile.workload.get("prefill_steps", "")
    lines = []
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
    return lines


def _merged(profile) -> list[str]:
    """Where `--merge` took latencies from the other profile, and where it pooled them."""
    workload = profile.workload
    lines = [
        f"  {m}: latencies at batch sizes {','.join(map(str, sizes))} from {workload['merged_from']}"
        for m, sizes in workload.get("merged_batches", {}).items()
    ]
    for m, runs in workload.get("merged_alone_pooled", {}).items():
        for sizes in runs:
            lines.append(
                f"  {m}: merged, alone at batch sizes {sizes[0]}-{sizes[-1]} pooled into one mean (where the two "
                "profiles meet the means fall; fitted non-decreasing again)"
            )
    return lines


def _alone(profile) -> list[str]:
    """Where the latencies alone came from: another profile (`--alone`), scaled, pooled, or too few steps."""
    workload = profile.workload
    lines = []
    if "alone_source" in workload:
        measured = workload.get("alone_measured", [])
        for m in profile.alone_ms:
            how = "its steps alone" if m in measured else "its step latencies"
            lines.append(f"  {m}: alone from {workload['alone_source']} ({how})")
    for m, st in workload.get("steps_by_state", {}).items():
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
    for m, n in workload.get("alone_too_few", {}).items():
        lines.append(
            f"  {m}: {n} steps alone, too few for latencies alone (min_steps {workload.get('min_steps')}): "
            "tune prices every step beside"
        )
    return lines


def _colocation(profile) -> list[str]:
    lines = []
    for m, term in profile.colocation.items():
        fit = term.get("fit", {})
        a, b = fit.get("busy_share", [term["at_share"]] * 2)
        lines.append(
            f"  {m}: step {term['ms_per_share']:+.3f} ms per unit of {'+'.join(term['co_runners'])}'s busy share "
            f"(measured at {a:.2f}; changed by {fit.get('step_change_ms', 0.0):+.3f} ms at {b:.2f})"
        )
    return lines
