"""A measured workload for the simulator's finite run (`SimConfig.requests`): each request's own routing.

The load generator (`tokenrouter bench --json`) keeps every request's record: tokens per model and hops.
For a two-model plan that is enough to give each request its own entry-model row of the routing matrix
(the other row stays the system's): hops entry→other = ⌈hops / 2⌉ (a request that ends away from the entry
model made one hop more out than back), and the entry model's decisions = its stays + those hops, where a
kept hop (c = 1) commits one of the entry model's tokens and a dropped one (c = 0) commits none. Requests
that are not alike (a router that fires on some prompts only) then run as they did, which the chain, with
N alike requests in flight forever, cannot describe.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from tokenrouter.throughput.inputs import PrefillCost, SystemInputs


class WorkloadError(ValueError):
    """Per-request records that cannot give routings (the message names the file or the reason)."""


def request_routing(inputs: SystemInputs, per_request: list[dict]) -> list[np.ndarray]:
    """One routing matrix per completed request, in order (failed requests are left out)."""
    if inputs.n_models != 2:
        raise WorkloadError(
            f"per-request routing needs a two-model plan (this one has {inputs.n_models}: "
            f"{', '.join(inputs.models)}); a request's record does not say which model each hop went to"
        )
    out = [_request_p(inputs, k, r) for k, r in enumerate(per_request) if r.get("ok")]
    if not out:
        raise WorkloadError("no completed request to take routings from")
    return out


def _request_p(inputs: SystemInputs, k: int, r: dict) -> np.ndarray:
    """The routing matrix of request k (a two-model plan): the entry's row from its tokens and hops."""
    entry = inputs.entry
    other = 1 - entry
    e, o = inputs.models[entry], inputs.models[other]
    keep = float(inputs.c[entry, other])
    tokens = r.get("tokens_per_model") or {}
    unknown = set(tokens) - {e, o}
    if unknown:
        raise WorkloadError(f"request {k}: tokens by {', '.join(sorted(unknown))}, not a model of the plan")
    hops_out = -(-int(r.get("hops", 0)) // 2)
    decisions = tokens.get(e, 0) - keep * hops_out + hops_out
    p_out = min(1.0, hops_out / decisions) if decisions > 0 else 0.0
    p = np.array(inputs.p, dtype=float)
    p[entry, entry], p[entry, other] = 1.0 - p_out, p_out
    return p


def request_lengths(per_request: list[dict]) -> tuple[int, ...] | None:
    """Each completed request's output tokens, in the order of `request_routing` (None where a record has none:
    the replay then gives every request the report's output length)."""
    lengths = [r.get("output_tokens") for r in per_request if r.get("ok")]
    if not lengths or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in lengths):
        return None
    return tuple(lengths)


def with_visit_costs(inputs: SystemInputs, per_request: list[dict]) -> SystemInputs:
    """`inputs` whose prefill costs have no `ms_per_visit` (a profile whose server did not count the requests
    each model reached, or a benchmark record that does not keep that counter) given one from these requests:
    `ms_per_token` × the tokens they committed, over the requests that reached the model (at the entry model
    every one; at another, those it wrote a token of). Failed requests are left out."""
    ok = [r for r in per_request if r.get("ok")]
    if not inputs.prefill or not ok:
        return inputs
    committed = sum(sum((r.get("tokens_per_model") or {}).values()) for r in ok)
    costs = []
    for i, (m, c) in enumerate(zip(inputs.models, inputs.prefill, strict=True)):
        if c is None or c.ms_per_visit is not None:
            costs.append(c)
            continue
        reached = sum(1 for r in ok if i == inputs.entry or (r.get("tokens_per_model") or {}).get(m, 0) > 0)
        costs.append(PrefillCost(c.ms_per_token, c.ms_per_token * committed / reached if reached else None))
    return dataclasses.replace(inputs, prefill=tuple(costs))


def _read_report(p: Path):
    """A `tokenrouter bench --json` report (or the one a `bench/matrix.py` record holds as `report`)."""
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkloadError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"{p}: not a readable JSON report: {exc}") from None
    return data.get("report", data) if isinstance(data, dict) else None


def read_requests(path: str | Path) -> tuple[list[dict], int | None]:
    """The per-request records of a `tokenrouter bench --json` report (or a `bench/matrix.py` record holding
    one as `report`), and the report's output length per request (None where it has none)."""
    p = Path(path)
    per, spec = _records(_read_report(p), str(p))
    if spec.get("request_rate") is not None:
        raise WorkloadError(
            f"{p}: an open-loop load ({spec['request_rate']:g} requests/s); the simulator replays a closed loop "
            "of --concurrency requests: replay a report of `tokenrouter bench` without --request-rate, or this "
            "one's arrivals with --arrivals"
        )
    return per, _positive_int(spec.get("output_len"))


def _records(report, where: str) -> tuple[list, dict]:
    """A report's per-request records (a WorkloadError naming `where` without any) and its `spec` ({} without)."""
    per = report.get("per_request") if isinstance(report, dict) else None
    if not isinstance(per, list) or not per:
        raise WorkloadError(
            f"{where}: no per_request records (write them with `tokenrouter bench --json FILE`)"
        )
    return per, report.get("spec") if isinstance(report.get("spec"), dict) else {}


def _positive_int(x) -> int | None:
    return int(x) if isinstance(x, int) and x > 0 else None


def read_arrivals(path: str | Path) -> tuple[tuple[float, ...], int | None, int | None]:
    """An open-loop `tokenrouter bench --request-rate --json` report's (or a `bench/matrix.py` record's) arrivals,
    output length and concurrency cap (`report_arrivals`)."""
    return report_arrivals(_read_report(Path(path)), str(path))


def report_arrivals(report, where: str) -> tuple[tuple[float, ...], int | None, int | None]:
    """An open-loop report's arrival times (ms after the run's start, ascending: each request's send time less
    its wait at the cap; failed requests arrived too), its output length per request and its concurrency cap
    (None where the report has none). `where` names the report in errors."""
    per, spec = _records(report, where)
    if spec.get("request_rate") is None:
        raise WorkloadError(
            f"{where}: a closed loop (no request rate): its requests did not arrive on their own clock; replay it "
            "with --requests"
        )
    try:
        times = sorted(1000.0 * (float(r["start_s"]) - float(r.get("queued_s", 0.0))) for r in per)
    except (KeyError, TypeError, ValueError):
        raise WorkloadError(
            f"{where}: a per_request record without a numeric start_s (an older report)"
        ) from None
    if any(not np.isfinite(t) for t in times):
        raise WorkloadError(f"{where}: a per_request record with a start time that is not a number")
    start = min(times[0], 0.0)
    return (
        tuple(t - start for t in times),
        _positive_int(spec.get("output_len")),
        _positive_int(spec.get("concurrency")),
    )
