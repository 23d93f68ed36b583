"""Frontend metrics, rendered by hand in the Prometheus text exposition format (no client library) from one table
of series (`SERIES`), and as a versioned JSON document (`Metrics.stats_document`, served at `GET /v1/stats`).

Counters are updated by the request manager (from StepOutputs and request lifecycles); per-subserver gauges
are the latest `SubserverStats` each subserver sent.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.subserver.batching import START_REASONS

PREFIX = "tokenrouter_"
# The version of the metrics' layout, exported as `tokenrouter_metrics_schema`; `profile --from-metrics` reads
# them by it. 2: the subservers count the steps that ran some request's first tokens (`first_steps_by_shape_total`
# and its siblings), which are the prefills. Exports without the gauge are version 1.
METRICS_SCHEMA = 2
# The version of the JSON stats document (`Metrics.stats_document`); `profile --from-metrics` reads it by it
# (throughput/stats_format.py is the reader's side, which must be changed with it).
STATS_SCHEMA_VERSION = 1


LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last is +Inf
    total: float = 0.0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)
        i = next((k for k, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        self.counts[i] += 1
        self.total += value

    def lines(self, name: str) -> list[str]:
        counts = self.counts or [0] * (len(self.buckets) + 1)
        out, acc = [], 0
        for b, c in zip((*map(repr, self.buckets), "+Inf"), counts, strict=True):
            acc += c
            out.append(f'{name}_bucket{{le="{b}"}} {acc}')
        return [*out, f"{name}_sum {self.total!r}", f"{name}_count {acc}"]

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass(slots=True)
class Metrics:
    models: list[str]
    requests_total: int = 0
    requests_finished: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by reason
    prompt_tokens: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by model
    hops: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))  # (from, to)
    stats: dict[str, m.SubserverStats] = field(default_factory=dict)
    ttft: Histogram = field(default_factory=Histogram)  # request arrival → its first token at the frontend
    e2e: Histogram = field(default_factory=Histogram)  # request arrival → finished (not aborted)
    # of the requests `e2e` counts, those to which each model wrote at least one token
    visits: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # the served plan: {"policy": name, "routing": its routing_digest}, read by `profile --from-metrics`
    plan_info: dict[str, str] = field(default_factory=dict)

    def on_stats(self, s: m.SubserverStats) -> None:
        self.stats[s.model] = s

    def stats_document(self, active: int) -> dict:
        """The counters and each subserver's latest stats as JSON (version STATS_SCHEMA_VERSION): what /metrics
        exposes, for tools and charts. Rates are the deltas of two documents over their `time` difference."""
        return {
            "object": "stats",
            "schema_version": STATS_SCHEMA_VERSION,
            "time": time.time(),
            "models": list(self.models),
            "plan": dict(self.plan_info),
            "requests_active": active,
            "requests_total": self.requests_total,
            "requests_finished": dict(self.requests_finished),
            "requests_ended": self.e2e.count,  # those e2e latency counts: finished, not aborted
            "requests_visiting": {x: self.visits.get(x, 0) for x in self.models},
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": {x: self.tokens.get(x, 0) for x in self.models},
            "hops": sum(self.hops.values()),
            "hops_by_route": _nested(self.hops),
            "subserver_stats": {
                x: msgspec.to_builtins(s, str_keys=True) for x, s in sorted(self.stats.items())
            },
        }

    def render(self, active: int) -> str:
        out: list[str] = []
        for series in SERIES:
            out.append(f"# HELP {PREFIX}{series.name} {series.help}")
            out.append(f"# TYPE {PREFIX}{series.name} {series.kind}")
            if series.kind == "histogram":
                out.extend(series.samples(self, active).lines(PREFIX + series.name))
                continue
            for labels, value in series.samples(self, active):
                lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                name = f"{PREFIX}{series.name}{{{lab}}}" if lab else f"{PREFIX}{series.name}"
                out.append(f"{name} {_num(value)}")
        return "\n".join(out) + "\n"


Samples = list[tuple[dict[str, str], float]]


@dataclass(frozen=True, slots=True)
class Series:
    """One exported series: its name (after PREFIX), type, help, and how to read its samples from the metrics
    and the number of active requests (a histogram's: the `Histogram`). Series whose samples are empty are still
    exported with their HELP and TYPE lines."""

    name: str
    kind: str  # "gauge", "counter" or "histogram"
    help: str
    samples: Callable[[Metrics, int], Samples | Histogram]


def _one(get: Callable[[Metrics, int], float]) -> Callable[[Metrics, int], Samples]:
    return lambda mt, active: [({}, get(mt, active))]


def _per_model(
    get: Callable[[m.SubserverStats], float], keep=lambda s: True
) -> Callable[[Metrics, int], Samples]:
    """A sample per subserver that reported (sorted by model), where `keep` says so."""
    return lambda mt, _: [({"model": x}, get(s)) for x, s in sorted(mt.stats.items()) if keep(s)]


def _by_batch(table: Callable[[m.SubserverStats], dict], value: Callable[[tuple], float]):
    """A sample per subserver and batch size of one of its by-batch-size tables."""

    def samples(mt: Metrics, _: int) -> Samples:
        by_model = sorted(mt.stats.items())
        return [
            ({"model": x, "bs": str(bs)}, value(v)) for x, s in by_model for bs, v in sorted(table(s).items())
        ]

    return samples


def _by_shape(table: Callable[[m.SubserverStats], dict], value: Callable[[tuple], float]):
    """A sample per subserver and step shape ("BS/Q/OVERLAP") of one of its by-shape tables, in the order of
    model, batch size, q, overlap."""

    def samples(mt: Metrics, _: int) -> Samples:
        shapes = sorted(
            ((x, key.split("/"), v) for x, s in sorted(mt.stats.items()) for key, v in table(s).items()),
            key=lambda t: (t[0], int(t[1][0]), int(t[1][1]), t[1][2]),
        )
        return [({"model": x, "bs": bs, "q": q, "overlap": o}, value(v)) for x, (bs, q, o), v in shapes]

    return samples


def _step_starts(mt: Metrics, _: int) -> Samples:
    return [
        ({"model": x, "reason": r}, s.step.starts.get(r, 0))
        for x, s in sorted(mt.stats.items())
        for r in START_REASONS
        if s.step.starts
    ]


_STALLS = "stalled steps (over 50 ms and 10x the mean step, per new token, of their batch size)"
_SHAPE = (
    "Steps run, by shape: batch size, the new tokens of the step's longest row rounded up to a power of two "
    "(q = 1: a decode step; a CUDA graph of (bs, q) pads every row to q), and overlap: alone, overlapped (by a step "
    "of a model sharing the GPU), stall, or untracked (no model shares the GPU)."
)
_FIRST = (
    "The steps among those that ran some request's first tokens on the model (a prefill: its prompt, or all it "
    "had on its first hop there), by the same shape."
)
_ALONE = (
    "Steps that no step of a model sharing the GPU overlapped (not stalls), by batch size; included in "
    "steps_by_batch_total."
)

# every series /metrics exports, in order
SERIES: tuple[Series, ...] = (
    Series("metrics_schema", "gauge", "The version of these metrics' layout (`profile --from-metrics` reads them by it).",
           _one(lambda mt, _: METRICS_SCHEMA)),
    Series("plan_info", "gauge", "The plan served: its policy name and the digest of its routing (models, entry, routes, "
           "routers).", lambda mt, _: [(mt.plan_info, 1)] if mt.plan_info else []),
    Series("requests_total", "counter", "Generation requests accepted (one per prompt).",
           _one(lambda mt, _: mt.requests_total)),
    Series("requests_active", "gauge", "Requests in flight.", _one(lambda mt, active: active)),
    Series("requests_finished_total", "counter", "Requests that ended, by reason (stop, length, abort, error).",
           lambda mt, _: [({"reason": r}, n) for r, n in sorted(mt.requests_finished.items())]),
    Series("prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", _one(lambda mt, _: mt.prompt_tokens)),
    Series("generation_tokens_total", "counter", "Tokens written, by the model that wrote them.",
           lambda mt, _: [({"model": x}, mt.tokens.get(x, 0)) for x in mt.models]),
    Series("hops_total", "counter", "Hand-offs of a request from one model to another.",
           lambda mt, _: [({"from": a, "to": b}, n) for (a, b), n in sorted(mt.hops.items())]),
    Series("requests_visiting_total", "counter", "Ended requests (those e2e_request_latency_seconds counts) to which "
           "the model wrote at least one token. Far fewer of them than the hops into the model would reach among "
           "alike requests means that its routing concentrates in a few requests (`tune` warns).",
           lambda mt, _: [({"model": x}, mt.visits.get(x, 0)) for x in mt.models]),
    Series("queue_waiting", "gauge", "Requests waiting to be scheduled on a subserver.",
           _per_model(lambda s: s.queue.waiting)),
    Series("queue_running", "gauge", "Requests runnable on a subserver.", _per_model(lambda s: s.queue.running)),
    Series("queue_pending", "gauge", "Requests held on a subserver while another model writes.",
           _per_model(lambda s: s.queue.pending)),
    Series("batch_size", "gauge", "Requests in the subserver's last step.", _per_model(lambda s: s.step.last_batch_size)),
    Series("kv_pages_total", "gauge", "Pages of the subserver's KV pool.", _per_model(lambda s: s.kv.pages_total)),
    Series("kv_pages_free", "gauge", "Free pages of the subserver's KV pool.", _per_model(lambda s: s.kv.pages_free)),
    Series("prefix_cache_enabled", "gauge", "1 where the subserver's engine has a prefix cache (0: off).",
           _per_model(lambda s: s.prefix.enabled)),
    Series("prefix_matched_tokens", "gauge", "Tokens whose KV came from the prefix cache when requests arrived on "
           "the subserver.", _per_model(lambda s: s.prefix.matched_tokens)),
    Series("prefix_computed_tokens", "gauge", "Tokens prefilled when requests arrived on the subserver (not found in "
           "the prefix cache).", _per_model(lambda s: s.prefix.computed_tokens)),
    Series("prefix_arrivals", "gauge", "Requests that arrived without KV on the subserver (prefix lookups).",
           _per_model(lambda s: s.prefix.arrivals)),
    Series("prefix_cached_blocks", "gauge", "Blocks the subserver's prefix cache holds now.",
           _per_model(lambda s: s.prefix.cached_blocks)),
    Series("prefix_cached_tokens", "gauge", "Tokens the subserver's prefix cache holds now.",
           _per_model(lambda s: s.prefix.cached_tokens)),
    Series("prefix_evicted_blocks", "gauge", "Prefix-cache blocks evicted to make room.",
           _per_model(lambda s: s.prefix.evicted_blocks)),
    Series("prefix_waited_rows", "gauge", "Arriving requests that waited one step for another arrival's prefill of "
           "the same uncached prefix, to match its blocks instead of computing them again.",
           _per_model(lambda s: s.prefix.waited_rows)),
    Series("batch_threshold", "gauge", "The subserver's delayed-batching threshold B_i as configured (lowered while "
           "few requests are active).", _per_model(lambda s: s.step.batch_threshold, lambda s: s.step.batch_threshold > 0)),
    Series("step_starts_total", "counter", "Steps by why they started: the threshold B_i reached (threshold), the "
           "threshold lowered while few requests were active (lowered), every request the subserver holds runnable "
           "(held), or the oldest runnable request waited max_delay_ms (timeout).", _step_starts),
    Series("step_latency_seconds", "gauge", "Latency of the subserver's last step.",
           _per_model(lambda s: s.step.last_ms / 1000.0)),
    Series("steps_total", "counter", "Steps run by the subserver.", _per_model(lambda s: s.step.count)),
    Series("step_latency_seconds_mean", "gauge", "Mean step latency since start (forward + route kernel).",
           _per_model(lambda s: s.step.busy_ms / 1000.0 / s.step.count, lambda s: s.step.count)),
    Series("step_seconds_total", "counter", "Time spent in steps (forward + route kernel).",
           _per_model(lambda s: s.step.busy_ms * 1e-3)),
    Series("uptime_seconds_total", "counter", "The subserver's time since it started, on step_seconds_total's clock "
           "and as of the same report (busy share over a window: the two counters' deltas divided).",
           _per_model(lambda s: s.step.uptime_ms * 1e-3)),
    Series("kv_deferred_rows_total", "counter", "Rows left out of a step because the KV pool could not hold them "
           "without evicting a request for them; they ran in a later step.", _per_model(lambda s: s.kv.deferred_rows)),
    Series("kv_evictions_total", "counter", "Held requests whose KV the engine evicted to fit a step (their history "
           "is kept).", _per_model(lambda s: s.kv.evictions)),
    Series("kv_reprefills_total", "counter", "Steps of an evicted request that ran its whole history again.",
           _per_model(lambda s: s.kv.reprefills)),
    Series("step_gaps_total", "counter", "Steps that followed the previous one back to back: the subserver could "
           "start them as the previous step ended (its threshold met then).", _per_model(lambda s: s.step.gaps)),
    Series("step_gap_seconds_total", "counter", "Host time between those back-to-back steps: from the previous "
           "step's end to their start (sending its hops, reading messages, scheduling); not in step_seconds_total.",
           _per_model(lambda s: s.step.gap_ms * 1e-3)),
    Series("hops_in_total", "counter", "Hops received from other subservers with the time they were sent.",
           _per_model(lambda s: s.hops.received)),
    Series("hop_delay_seconds_total", "counter", "The delay of those hops: from the end of the sender's step (or, "
           "where this subserver was in a step then, that step's end) to this subserver's scheduler taking the hop "
           "in.", _per_model(lambda s: s.hops.delay_ms * 1e-3)),
    Series("kernel_loads_total", "counter", "Triton kernels the subserver's process built (compiled, or loaded from "
           "Triton's disk cache) since it started serving: a first-time build in a step is a stall of about half a "
           "second.", _per_model(lambda s: s.kernels.count)),
    Series("kernel_load_seconds_total", "counter", "The time those builds took, in steps or between them.",
           _per_model(lambda s: s.kernels.ms * 1e-3)),
    Series("step_rows_total", "counter", "Rows run, summed over steps.", _per_model(lambda s: s.step.rows)),
    Series("step_tokens_total", "counter", "Tokens run: prefills, extend suffixes, one per decode row.",
           _per_model(lambda s: s.step.new_tokens)),
    Series("steps_by_batch_total", "counter", "Steps run, by batch size.",
           _by_batch(lambda s: s.tables.by_bs, lambda v: v[0])),
    Series("step_seconds_by_batch_total", "counter", "Time spent in steps, by batch size.",
           _by_batch(lambda s: s.tables.by_bs, lambda v: v[1] / 1000.0)),
    Series("slow_steps_by_batch_total", "counter", f"The {_STALLS}, by batch size; included in steps_by_batch_total.",
           _by_batch(lambda s: s.tables.slow_by_bs, lambda v: v[0])),
    Series("slow_step_seconds_by_batch_total", "counter", f"Time spent in {_STALLS}, by batch size; included in "
           "step_seconds_by_batch_total.", _by_batch(lambda s: s.tables.slow_by_bs, lambda v: v[1] / 1000.0)),
    Series("alone_steps_by_batch_total", "counter", _ALONE, _by_batch(lambda s: s.tables.alone_by_bs, lambda v: v[0])),
    Series("alone_step_seconds_by_batch_total", "counter", "Time spent in those steps, by batch size; included in "
           "step_seconds_by_batch_total.", _by_batch(lambda s: s.tables.alone_by_bs, lambda v: v[1] / 1000.0)),
    Series("step_tokens_by_batch_total", "counter", "Tokens run in steps (prefills, extend suffixes, one per decode "
           "row), by batch size.", _by_batch(lambda s: s.tables.by_bs, lambda v: v[2])),
    Series("alone_step_tokens_by_batch_total", "counter", "Tokens run in the alone steps, by batch size.",
           _by_batch(lambda s: s.tables.alone_by_bs, lambda v: v[2])),
    Series("steps_by_shape_total", "counter", _SHAPE, _by_shape(lambda s: s.tables.by_shape, lambda v: v[0] * 1.0)),
    Series("step_seconds_by_shape_total", "counter", "Time spent in those steps.",
           _by_shape(lambda s: s.tables.by_shape, lambda v: v[1] * 1e-3)),
    Series("step_tokens_by_shape_total", "counter", "Tokens run in those steps.",
           _by_shape(lambda s: s.tables.by_shape, lambda v: v[2] * 1.0)),
    Series("first_steps_by_shape_total", "counter", _FIRST,
           _by_shape(lambda s: s.tables.first_by_shape, lambda v: v[0] * 1.0)),
    Series("first_step_seconds_by_shape_total", "counter", "Time spent in those steps.",
           _by_shape(lambda s: s.tables.first_by_shape, lambda v: v[1] * 1e-3)),
    Series("first_step_rows_by_shape_total", "counter", "The rows of those steps that were such first runs.",
           _by_shape(lambda s: s.tables.first_by_shape, lambda v: v[2] * 1.0)),
    Series("time_to_first_token_seconds", "histogram", "From a request's arrival to its first token.",
           lambda mt, _: mt.ttft),
    Series("e2e_request_latency_seconds", "histogram", "From a request's arrival to its end (finished requests).",
           lambda mt, _: mt.e2e),
)  # fmt: skip


def _nested(pairs: dict[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (a, b), n in sorted(pairs.items()):
        out.setdefault(a, {})[b] = n
    return out


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(v: float) -> str:
    return str(int(v)) if isinstance(v, int) or float(v).is_integer() else repr(float(v))
