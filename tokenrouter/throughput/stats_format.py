"""What `profile --from-metrics` reads from a server: its counters at one moment (`Counters`), from the JSON stats
document a server serves at `GET /v1/stats` (`read_stats_document`), or from an older server's Prometheus text
(`from_metrics.counters_from_prometheus`).

The stats document is versioned by its `schema_version`; this module is the reader's side of it, written
without the runtime's classes (the throughput model does not import the runtime). Version 1, the fields read:

    {"object": "stats", "schema_version": 1, "models": [NAME, ...],
     "plan": {"policy": NAME, "routing": ROUTING_DIGEST},           (absent or {} where the server does not say)
     "generation_tokens": {MODEL: N}, "hops_by_route": {FROM: {TO: N}},
     "requests_ended": N, "requests_visiting": {MODEL: N},
     "subserver_stats": {MODEL: {
         "step": {"busy_ms", "uptime_ms", "batch_threshold", "gaps", "gap_ms", ...},
         "tables": {"by_bs": {BS: [STEPS, MS, TOKENS]}, "slow_by_bs": {BS: [STEPS, MS]},
                    "alone_by_bs": {BS: [STEPS, MS, TOKENS]},
                    "by_shape": {"BS/Q/OVERLAP": [STEPS, MS, TOKENS]},
                    "first_by_shape": {"BS/Q/OVERLAP": [STEPS, MS, FIRST_RUNS]}},
         "hops": {"received": N, "delay_ms": MS}, ...}}}

Counters are totals since the server started; a profile takes the difference of two (`Counters.minus`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# the newest stats document this reader knows (`schema_version`)
STATS_SCHEMA_VERSION = 1

Shape = tuple[
    int, int, str
]  # (batch size, q: the longest row's new tokens rounded up to a power of 2, overlap)


class MetricsProfileError(ValueError):
    """The metrics cannot make a profile; the message says what is missing."""


class StatsFormatError(MetricsProfileError):
    """The stats document is not one this reader knows; the message says why."""


@dataclass
class ModelCounters:
    """One subserver's counters: per batch size [steps, seconds] of every step, of the stalls among them, and of
    the steps no co-runner overlapped; per shape [steps, seconds, count] of every step (count: new tokens) and of
    those that ran some request's first tokens there (count: such rows); the step seconds and the uptime they
    fall in; back-to-back steps and the host seconds between; hops received and their delay in seconds."""

    by_bs: dict[int, list[float]] = field(default_factory=dict)
    slow_by_bs: dict[int, list[float]] = field(default_factory=dict)
    alone_by_bs: dict[int, list[float]] = field(default_factory=dict)
    by_shape: dict[Shape, list[float]] = field(default_factory=dict)
    first_by_shape: dict[Shape, list[float]] = field(default_factory=dict)
    busy: list[float] = field(default_factory=lambda: [0.0, 0.0])  # [step seconds, uptime seconds]
    gaps: list[float] = field(default_factory=lambda: [0.0, 0.0])  # [steps, seconds]
    hops_in: list[float] = field(default_factory=lambda: [0.0, 0.0])  # [hops, seconds]
    threshold: int = 0  # B_i as configured (a gauge; 0: not said)

    def minus(self, before: ModelCounters | None) -> ModelCounters:
        """What was counted since `before` (gauges as of now)."""
        b = before or ModelCounters()
        return ModelCounters(
            **{name: _minus_table(getattr(self, name), getattr(b, name)) for name in _TABLES},
            **{
                name: _minus_row(getattr(self, name), getattr(b, name))
                for name in ("busy", "gaps", "hops_in")
            },
            threshold=self.threshold,
        )


_TABLES = ("by_bs", "slow_by_bs", "alone_by_bs", "by_shape", "first_by_shape")


@dataclass
class Counters:
    """A server's counters at one moment. `named`: every model the source names (a server of another plan names
    others); `counts_first`: whether the server counts the steps that ran a request's first tokens (else they
    are guessed from the step shapes); `plan`: the served plan's {"policy", "routing"}, where it says."""

    named: set[str] = field(default_factory=set)
    models: dict[str, ModelCounters] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)  # generated, by the model that wrote them
    hops: dict[tuple[str, str], float] = field(default_factory=dict)  # (from, to) -> hand-offs
    visits: dict[str, float] = field(default_factory=dict)  # model -> ended requests it wrote a token of
    ended: float = 0.0  # requests that ended
    counts_first: bool = True
    plan: dict[str, str] = field(default_factory=dict)

    def minus(self, before: Counters | None) -> Counters:
        """The counters of the window since `before` (None: since the server started)."""
        b = before or Counters()
        return Counters(
            named=self.named,
            models={x: c.minus(b.models.get(x)) for x, c in self.models.items()},
            tokens=_minus_flat(self.tokens, b.tokens),
            hops=_minus_flat(self.hops, b.hops),
            visits=_minus_flat(self.visits, b.visits),
            ended=self.ended - b.ended,
            counts_first=self.counts_first,
            plan=self.plan,
        )


def _minus_flat(now: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in now.items()}


def _minus_row(now: list[float], before: list[float] | None) -> list[float]:
    return [v - (before[i] if before else 0.0) for i, v in enumerate(now)]


def _minus_table(now: dict, before: dict) -> dict:
    return {k: _minus_row(v, before.get(k)) for k, v in now.items()}


def read_stats_document(doc: object) -> Counters:
    """The counters of a stats document (`GET /v1/stats`), refused with a StatsFormatError where it is not one or
    of a version this reader does not know."""
    if not isinstance(doc, dict) or doc.get("object") != "stats":
        raise StatsFormatError('not a tokenrouter stats document (GET /v1/stats): no "object": "stats"')
    version = doc.get("schema_version")
    if version != STATS_SCHEMA_VERSION:
        said = "has no schema_version" if version is None else f"is of schema_version {version!r}"
        raise StatsFormatError(
            f"the stats document {said}; this tokenrouter reads version {STATS_SCHEMA_VERSION}: read it with the "
            "tokenrouter of that server"
        )
    try:
        return _counters(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise StatsFormatError(
            f"malformed stats document (schema_version 1): {type(e).__name__}: {e}"
        ) from None


def _counters(doc: dict) -> Counters:
    hops = {(a, b): float(n) for a, row in doc["hops_by_route"].items() for b, n in row.items()}
    stats = doc["subserver_stats"]
    return Counters(
        named={*doc["models"], *stats, *(x for pair in hops for x in pair)},
        models={x: _model_counters(s) for x, s in stats.items()},
        tokens={x: float(n) for x, n in doc["generation_tokens"].items()},
        hops=hops,
        visits={x: float(n) for x, n in doc["requests_visiting"].items()},
        ended=float(doc["requests_ended"]),
        counts_first=True,
        plan=dict(doc.get("plan") or {}),
    )


def _model_counters(s: dict) -> ModelCounters:
    step, tables, hops = s["step"], s["tables"], s["hops"]
    return ModelCounters(
        by_bs=_by_bs(tables["by_bs"]),
        slow_by_bs=_by_bs(tables["slow_by_bs"]),
        alone_by_bs=_by_bs(tables["alone_by_bs"]),
        by_shape=_by_shape(tables["by_shape"]),
        first_by_shape=_by_shape(tables["first_by_shape"]),
        busy=[step["busy_ms"] * 1e-3, step["uptime_ms"] * 1e-3],
        gaps=[float(step["gaps"]), step["gap_ms"] * 1e-3],
        hops_in=[float(hops["received"]), hops["delay_ms"] * 1e-3],
        threshold=int(step["batch_threshold"]),
    )


def _by_bs(table: dict) -> dict[int, list[float]]:
    """{batch size: [steps, ms, ...]} (keys as JSON strings) -> {batch size: [steps, seconds]}."""
    return {int(bs): [float(v[0]), v[1] / 1000.0] for bs, v in table.items()}


def _by_shape(table: dict) -> dict[Shape, list[float]]:
    """{"BS/Q/OVERLAP": [steps, ms, count]} -> {(bs, q, overlap): [steps, seconds, count]}."""
    out = {}
    for key, (n, ms, count) in table.items():
        bs, q, overlap = key.split("/")
        out[(int(bs), int(q), overlap)] = [float(n), ms * 1e-3, float(count)]
    return out
