"""The load generator's report: `summarize` (totals, percentiles, each request's record), `format_report` (the
table), `write_report` (the JSON)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from tokenrouter.loadgen.spec import LoadSpec, RequestResult


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(spec: LoadSpec, model: str, results: list[RequestResult], wall_s: float) -> dict:
    """The report: totals, percentiles, and `per_request` (each request's own record, in prompt order).
    `drain_s` is the time from the last request's send to the end of the run, when fewer than the
    concurrency may be in flight: the part of `wall_s` that a steady-state model does not describe.
    `queued_ms` (an open loop's) is the wait of a request that arrived at the concurrency cap."""
    ok = [r for r in results if r.ok]
    per_model = _tokens_per_model(ok)
    return {
        "url": spec.url,
        "model": model,
        "spec": _spec_record(spec),
        "load": spec.describe(),
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "wall_s": wall_s,
        **_throughput(ok, wall_s),
        **_goodput(spec, ok, len(results), wall_s),
        **_latency(results, ok),
        "tokens_per_model": per_model,
        "share_per_request": share_spread(ok, per_model),
        "hops": sum(r.hops for r in ok),
        "drain_s": wall_s - max((r.start_s for r in results), default=0.0),
        **_by_turn(ok),
        "per_request": [_record(r) for r in results],
    }


def _spec_record(spec: LoadSpec) -> dict:
    """The load's settings as the report records them: no API key; a closed loop's rate (inf) written null
    (JSON has no infinity)."""
    return asdict(spec) | {"api_key": None, "request_rate": None if spec.closed_loop else spec.request_rate}


def _tokens_per_model(ok: list[RequestResult]) -> dict[str, int]:
    per_model: dict[str, int] = {}
    for r in ok:
        for name, n in r.tokens_per_model.items():
            per_model[name] = per_model.get(name, 0) + n
    return per_model


def _throughput(ok: list[RequestResult], wall_s: float) -> dict:
    """Tokens, and tokens and requests per second of wall time."""
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    return {
        "output_tokens": out_tokens,
        "prompt_tokens": prompt_tokens,
        "decode_throughput_tok_s": out_tokens / wall_s if wall_s > 0 else 0.0,
        "total_throughput_tok_s": (out_tokens + prompt_tokens) / wall_s if wall_s > 0 else 0.0,
        "request_throughput_req_s": len(ok) / wall_s if wall_s > 0 else 0.0,
    }


def _latency(results: list[RequestResult], ok: list[RequestResult]) -> dict:
    """The spreads of TTFT, TPOT, E2E latency, an open loop's wait at the cap, and the time from arrival."""
    tpots = [_tpot_s(r) for r in ok if r.output_tokens > 1]
    return {
        "ttft_ms": _spread([1e3 * r.ttft_s for r in ok]),
        "tpot_ms": _spread([1e3 * t for t in tpots]),
        "e2e_s": _spread([r.e2e_s for r in ok]),
        "queued_ms": _spread([1e3 * r.queued_s for r in results]),
        # what the client waited in all: from the request's arrival (its wait at the cap included) to its end
        "from_arrival_s": _spread([r.queued_s + r.e2e_s for r in ok]),
    }


def _record(r: RequestResult) -> dict:
    """One request's own record in the report."""
    return {
        "ok": r.ok,
        "start_s": r.start_s,
        "queued_s": r.queued_s,
        "ttft_s": r.ttft_s,
        "e2e_s": r.e2e_s,
        "output_tokens": r.output_tokens,
        "tokens_per_model": r.tokens_per_model,
        "hops": r.hops,
        **({"conversation": r.conversation, "turn": r.turn} if r.turn else {}),
    }


def _by_turn(ok: list[RequestResult]) -> dict:
    """A conversation load's TTFT by turn (mean, p50, p99 in ms; keys are turn numbers as strings)."""
    turns = sorted({r.turn for r in ok if r.turn})
    if not turns:
        return {}
    return {"ttft_ms_by_turn": {str(k): _spread([1e3 * r.ttft_s for r in ok if r.turn == k]) for k in turns}}


def _tpot_s(r: RequestResult) -> float:
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0


def _goodput(spec: LoadSpec, ok: list[RequestResult], sent: int, wall_s: float) -> dict:
    """With service-level objectives: the requests that completed within both (`slo_met`, of all sent) and
    those per second (`goodput_req_s`). A one-token request has no TPOT to miss."""
    if spec.slo_ttft_ms is None and spec.slo_tpot_ms is None:
        return {}
    ttft, tpot = spec.slo_ttft_ms or math.inf, spec.slo_tpot_ms or math.inf
    met = sum(1 for r in ok if 1e3 * r.ttft_s <= ttft and 1e3 * _tpot_s(r) <= tpot)
    return {
        "slo": {"ttft_ms": spec.slo_ttft_ms, "tpot_ms": spec.slo_tpot_ms},
        "slo_met": met,
        "slo_met_share": met / sent if sent else 0.0,
        "goodput_req_s": met / wall_s if wall_s > 0 else 0.0,
    }


def write_report(report: dict, path: str | Path) -> None:
    """The report as JSON, a NaN (a percentile of nothing: every request failed) or infinity written as null,
    which JSON readers other than Python's accept."""
    from tokenrouter.outfile import finite_json, write_replacing

    write_replacing(path, json.dumps(finite_json(report), indent=2) + "\n")


def _spread(values: list[float]) -> dict[str, float]:
    """Mean, p50 and p99 (NaN for no values)."""
    mean = sum(values) / len(values) if values else float("nan")
    return {"mean": mean, "p50": _percentile(values, 0.5), "p99": _percentile(values, 0.99)}


def share_spread(ok: list[RequestResult], per_model: dict[str, int]) -> dict[str, dict]:
    """Per model (when more than one wrote tokens): how its share of a request's tokens is spread over the
    requests: how many requests it wrote any token of, and the p50 / p99 / max of its share. Routing that
    fires on a few requests only (a heavy tail the throughput model, which assumes alike requests, cannot
    see) shows here as a low p50 and a high max."""
    if len(per_model) < 2:
        return {}
    out = {}
    for name in sorted(per_model):
        shares = [
            r.tokens_per_model.get(name, 0) / total
            for r in ok
            if (total := sum(r.tokens_per_model.values())) > 0
        ]
        out[name] = {
            "requests_with_any": sum(1 for x in shares if x > 0),
            "requests": len(shares),
            "p50": _percentile(shares, 0.5),
            "p99": _percentile(shares, 0.99),
            "max": max(shares, default=float("nan")),
        }
    return out


def format_report(report: dict) -> str:
    """The report as a two-column table (metric, value), its errors below."""
    rows = [*_headline_rows(report), *_load_rows(report), *_model_rows(report)]
    warm = report.get("warmup") or {}
    if warm.get("requests"):
        rows.append(("warm-up requests (not counted)", f"{warm['requests']} ({warm['failed']} failed)"))
    rows = [("metric", "value"), *((k, str(v)) for k, v in rows)]
    width, value_width = (max(len(row[i]) for row in rows) for i in (0, 1))
    lines = [f"| {k.ljust(width)} | {v.ljust(value_width)} |" for k, v in rows]
    lines.insert(1, f"| {'-' * width} | {'-' * value_width} |")
    if report["errors"]:
        lines.append("errors: " + "; ".join(report["errors"]))
    if warm.get("errors"):
        lines.append("warm-up errors: " + "; ".join(warm["errors"]))
    return "\n".join(lines)


def _headline_rows(report: dict) -> list[tuple[str, str]]:
    """Requests, wall time, throughput, and the TTFT / TPOT / E2E spreads."""
    ttft, tpot, e2e = report["ttft_ms"], report["tpot_ms"], report["e2e_s"]
    return [
        ("load", report.get("load", "")),
        ("requests (ok / failed)", f"{report['completed']} / {report['failed']}"),
        ("wall time (s)", f"{report['wall_s']:.2f}"),
        ("output tokens", f"{report['output_tokens']}"),
        ("decode throughput (tok/s)", f"{report['decode_throughput_tok_s']:.1f}"),
        ("request throughput (req/s)", f"{report.get('request_throughput_req_s', 0.0):.2f}"),
        (
            "TTFT mean / p50 / p99 (ms)",
            f"{ttft.get('mean', math.nan):.1f} / {ttft['p50']:.1f} / {ttft['p99']:.1f}",
        ),
        (
            "TPOT mean / p50 / p99 (ms)",
            f"{tpot.get('mean', math.nan):.2f} / {tpot['p50']:.2f} / {tpot['p99']:.2f}",
        ),
        (
            "E2E mean / p50 / p99 (s)",
            f"{e2e.get('mean', math.nan):.2f} / {e2e['p50']:.2f} / {e2e['p99']:.2f}",
        ),
    ]


def _load_rows(report: dict) -> list[tuple[str, str]]:
    """The SLOs met, an open loop's wait at the cap, requests in flight, hops, the drain."""
    rows = []
    if "slo" in report:
        bounds = [f"{k.split('_')[0].upper()} <= {v:g} ms" for k, v in report["slo"].items() if v is not None]
        rows.append(
            (
                f"within the SLO ({', '.join(bounds)})",
                f"{report['slo_met']} of {report['requests']} ({100 * report['slo_met_share']:.1f}%), "
                f"goodput {report['goodput_req_s']:.2f} req/s",
            )
        )
    queued = report.get("queued_ms")
    if queued and (report.get("spec") or {}).get("request_rate") is not None:
        rows.append(("queued at the cap p50 / p99 (ms)", f"{queued['p50']:.1f} / {queued['p99']:.1f}"))
        if arrival := report.get("from_arrival_s"):
            rows.append(("from arrival to end p50 / p99 (s)", f"{arrival['p50']:.2f} / {arrival['p99']:.2f}"))
    if "max_in_flight" in report:
        rows.append(("most requests in flight", f"{report['max_in_flight']}"))
    rows += [
        ("hops", f"{report['hops']}"),
        ("drain after the last send (s)", f"{report['drain_s']:.2f}"),
    ]
    return rows


def _model_rows(report: dict) -> list[tuple[str, str]]:
    """Tokens by model, each model's share of a request, TTFT by turn, prefix cache hits."""
    rows = []
    total = sum(report["tokens_per_model"].values())
    for name, n in sorted(report["tokens_per_model"].items()):
        rows.append((f"tokens by {name}", f"{n} ({100.0 * n / total:.1f}%)" if total else str(n)))
    for name, sp in (report.get("share_per_request") or {}).items():
        rows.append(
            (
                f"{name}'s share of a request p50 / p99 / max",
                f"{100 * sp['p50']:.1f} / {100 * sp['p99']:.1f} / {100 * sp['max']:.1f}% "
                f"(any in {sp['requests_with_any']} of {sp['requests']})",
            )
        )
    for turn, sp in (report.get("ttft_ms_by_turn") or {}).items():
        rows.append((f"TTFT of turn {turn} p50 / p99 (ms)", f"{sp['p50']:.1f} / {sp['p99']:.1f}"))
    for name, pc in (report.get("prefix_cache") or {}).items():
        value = (
            f"{100 * pc['hit_rate']:.1f}% ({pc['matched_tokens']} matched / {pc['computed_tokens']} computed)"
            if pc["enabled"]
            else "off"
        )
        rows.append((f"prefix cache hits on {name}", value))
    for name, st in (report.get("steps_by_model") or {}).items():
        rows.append((f"steps of {name}: ms / rows / tokens per step, busy",
                     f"{st['steps']}: {st['ms_per_step']:.2f} / {st['rows_per_step']:.2f} / "
                     f"{st['tokens_per_step']:.1f}, {100 * st['busy']:.0f}%"))  # fmt: skip
    return rows
