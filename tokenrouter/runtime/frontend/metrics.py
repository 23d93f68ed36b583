"""Frontend metrics, rendered by hand in the Prometheus text exposition format (no client library).

Counters are updated by the request manager (from StepOutputs and request lifecycles); per-subserver gauges
are the latest `SubserverStats` each subserver sent.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.subserver.batching import START_REASONS

PREFIX = "tokenrouter_"
# The version of the metrics' layout, exported as `tokenrouter_metrics_schema`; `profile --from-metrics` reads
# them by it. 2: the subservers count the steps that ran some request's first tokens (`first_steps_by_shape_total`
# and its siblings), which are the prefills. Exports without the gauge are version 1.
METRICS_SCHEMA = 2


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

    def render(self, active: int) -> str:
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[dict[str, str], float]]) -> None:
            out.append(f"# HELP {PREFIX}{name} {help_}")
            out.append(f"# TYPE {PREFIX}{name} {kind}")
            for labels, value in samples:
                lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                out.append(
                    f"{PREFIX}{name}{{{lab}}} {_num(value)}" if lab else f"{PREFIX}{name} {_num(value)}"
                )

        metric(
            "metrics_schema",
            "gauge",
            "The version of these metrics' layout (`profile --from-metrics` reads them by it).",
            [({}, METRICS_SCHEMA)],
        )
        if self.plan_info:
            metric(
                "plan_info",
                "gauge",
                "The plan served: its policy name and the digest of its routing (models, entry, routes, routers).",
                [(self.plan_info, 1)],
            )
        metric(
            "requests_total",
            "counter",
            "Generation requests accepted (one per prompt).",
            [({}, self.requests_total)],
        )
        metric("requests_active", "gauge", "Requests in flight.", [({}, active)])
        metric(
            "requests_finished_total",
            "counter",
            "Requests that ended, by reason (stop, length, abort, error).",
            [({"reason": r}, n) for r, n in sorted(self.requests_finished.items())],
        )
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of accepted requests.",
            [({}, self.prompt_tokens)],
        )
        metric(
            "generation_tokens_total",
            "counter",
            "Tokens written, by the model that wrote them.",
            [({"model": x}, self.tokens.get(x, 0)) for x in self.models],
        )
        metric(
            "hops_total",
            "counter",
            "Hand-offs of a request from one model to another.",
            [({"from": a, "to": b}, n) for (a, b), n in sorted(self.hops.items())],
        )
        metric(
            "requests_visiting_total",
            "counter",
            "Ended requests (those e2e_request_latency_seconds counts) to which the model wrote at least one "
            "token. Far fewer of them than the hops into the model would reach among alike requests means that "
            "its routing concentrates in a few requests (`tune` warns).",
            [({"model": x}, self.visits.get(x, 0)) for x in self.models],
        )
        gauges = [
            ("queue_waiting", "Requests waiting to be scheduled on a subserver.", "waiting"),
            ("queue_running", "Requests runnable on a subserver.", "running"),
            ("queue_pending", "Requests held on a subserver while another model writes.", "pending"),
            ("batch_size", "Requests in the subserver's last step.", "last_batch_size"),
            ("kv_pages_total", "Pages of the subserver's KV pool.", "kv_pages_total"),
            ("kv_pages_free", "Free pages of the subserver's KV pool.", "kv_pages_free"),
            (
                "prefix_cache_enabled",
                "1 where the subserver's engine has a prefix cache (0: off).",
                "prefix_cache",
            ),
            (
                "prefix_matched_tokens",
                "Tokens whose KV came from the prefix cache when requests arrived on the subserver.",
                "prefix_matched_tokens",
            ),
            (
                "prefix_computed_tokens",
                "Tokens prefilled when requests arrived on the subserver (not found in the prefix cache).",
                "prefix_computed_tokens",
            ),
            (
                "prefix_arrivals",
                "Requests that arrived without KV on the subserver (prefix lookups).",
                "prefix_arrivals",
            ),
            (
                "prefix_cached_blocks",
                "Blocks the subserver's prefix cache holds now.",
                "prefix_cached_blocks",
            ),
            (
                "prefix_cached_tokens",
                "Tokens the subserver's prefix cache holds now.",
                "prefix_cached_tokens",
            ),
            ("prefix_evicted_blocks", "Prefix-cache blocks evicted to make room.", "prefix_evicted_blocks"),
        ]
        for name, help_, attr in gauges:
            metric(
                name,
                "gauge",
                help_,
                [({"model": x}, float(getattr(s, attr))) for x, s in sorted(self.stats.items())],
            )
        metric(
            "batch_threshold",
            "gauge",
            "The subserver's delayed-batching threshold B_i as configured (lowered while few requests are active).",
            [
                ({"model": x}, s.batch_threshold)
                for x, s in sorted(self.stats.items())
                if s.batch_threshold > 0
            ],
        )
        metric(
            "step_starts_total",
            "counter",
            "Steps by why they started: the threshold B_i reached (threshold), the threshold lowered while few "
            "requests were active (lowered), every request the subserver holds runnable (held), or the oldest "
            "runnable request waited max_delay_ms (timeout).",
            [
                ({"model": x, "reason": r}, s.step_starts.get(r, 0))
                for x, s in sorted(self.stats.items())
                for r in START_REASONS
                if s.step_starts
            ],
        )
        metric(
            "step_latency_seconds",
            "gauge",
            "Latency of the subserver's last step.",
            [({"model": x}, s.last_step_ms / 1000.0) for x, s in sorted(self.stats.items())],
        )
        metric(
            "steps_total",
            "counter",
            "Steps run by the subserver.",
            [({"model": x}, s.steps) for x, s in sorted(self.stats.items())],
        )
        stats = sorted(self.stats.items())
        metric(
            "step_latency_seconds_mean",
            "gauge",
            "Mean step latency since start (forward + route kernel).",
            [({"model": x}, s.busy_ms / 1000.0 / s.steps) for x, s in stats if s.steps],
        )
        for name, help_, attr, scale in (
            ("step_seconds_total", "Time spent in steps (forward + route kernel).", "busy_ms", 1e-3),
            (
                "uptime_seconds_total",
                "The subserver's time since it started, on step_seconds_total's clock and as of the same "
                "report (busy share over a window: the two counters' deltas divided).",
                "uptime_ms",
                1e-3,
            ),
            (
                "kv_deferred_rows_total",
                "Rows left out of a step because the KV pool could not hold them without evicting a request "
                "for them; they ran in a later step.",
                "kv_deferred_rows",
                1,
            ),
            (
                "kv_evictions_total",
                "Held requests whose KV the engine evicted to fit a step (their history is kept).",
                "kv_evictions",
                1,
            ),
            (
                "kv_reprefills_total",
                "Steps of an evicted request that ran its whole history again.",
                "kv_reprefills",
                1,
            ),
            (
                "step_gaps_total",
                "Steps that followed the previous one back to back: the subserver could start them as the "
                "previous step ended (its threshold met then).",
                "gaps",
                1,
            ),
            (
                "step_gap_seconds_total",
                "Host time between those back-to-back steps: from the previous step's end to their start "
                "(sending its hops, reading messages, scheduling); not in step_seconds_total.",
                "gap_ms",
                1e-3,
            ),
            (
                "hops_in_total",
                "Hops received from other subservers with the time they were sent.",
                "hops_in",
                1,
            ),
            (
                "hop_delay_seconds_total",
                "The delay of those hops: from the end of the sender's step (or, where this subserver was in a "
                "step then, that step's end) to this subserver's scheduler taking the hop in.",
                "hop_delay_ms",
                1e-3,
            ),
            (
                "kernel_loads_total",
                "Triton kernels the subserver's process built (compiled, or loaded from Triton's disk cache) "
                "since it started serving: a first-time build in a step is a stall of about half a second.",
                "kernel_loads",
                1,
            ),
            (
                "kernel_load_seconds_total",
                "The time those builds took, in steps or between them.",
                "kernel_load_ms",
                1e-3,
            ),
            ("step_rows_total", "Rows run, summed over steps.", "rows_total", 1),
            (
                "step_tokens_total",
                "Tokens run: prefills, extend suffixes, one per decode row.",
                "new_tokens_total",
                1,
            ),
        ):
            metric(name, "counter", help_, [({"model": x}, getattr(s, attr) * scale) for x, s in stats])
        stalls = "stalled steps (over 50 ms and 10x the mean step, per new token, of their batch size)"
        for prefix, attr, steps_help, seconds_help in (
            ("", "step_ms_by_bs", "Steps run, by batch size.", "Time spent in steps, by batch size."),
            (
                "slow_",
                "slow_ms_by_bs",
                f"The {stalls}, by batch size; included in steps_by_batch_total.",
                f"Time spent in {stalls}, by batch size; included in step_seconds_by_batch_total.",
            ),
            (
                "alone_",
                "alone_ms_by_bs",
                "Steps that no step of a model sharing the GPU overlapped (not stalls), by batch size; included "
                "in steps_by_batch_total.",
                "Time spent in those steps, by batch size; included in step_seconds_by_batch_total.",
            ),
        ):
            by_bs = [
                (x, str(bs), n, ms) for x, s in stats for bs, (n, ms) in sorted(getattr(s, attr).items())
            ]
            metric(f"{prefix}steps_by_batch_total", "counter", steps_help,
                   [({"model": x, "bs": bs}, n) for x, bs, n, _ in by_bs])  # fmt: skip
            metric(f"{prefix}step_seconds_by_batch_total", "counter", seconds_help,
                   [({"model": x, "bs": bs}, ms / 1000.0) for x, bs, _, ms in by_bs])  # fmt: skip
        for prefix, attr, help_ in (
            (
                "",
                "tokens_by_bs",
                "Tokens run in steps (prefills, extend suffixes, one per decode row), by batch size.",
            ),
            ("alone_", "alone_tokens_by_bs", "Tokens run in the alone steps, by batch size."),
        ):
            metric(f"{prefix}step_tokens_by_batch_total", "counter", help_,
                   [({"model": x, "bs": str(bs)}, k) for x, s in stats for bs, k in sorted(getattr(s, attr).items())])  # fmt: skip
        by_shape = (
            ("step_ms_by_shape", (
                ("steps_by_shape_total", "Steps run, by shape: batch size, the new tokens of the step's longest row "
                 "rounded up to a power of two (q = 1: a decode step; a CUDA graph of (bs, q) pads every row to q), "
                 "and overlap: alone, overlapped (by a step of a model sharing the GPU), stall, or untracked "
                 "(no model shares the GPU).", 0, 1.0),
                ("step_seconds_by_shape_total", "Time spent in those steps.", 1, 1e-3),
                ("step_tokens_by_shape_total", "Tokens run in those steps.", 2, 1.0),
            )),
            ("first_ms_by_shape", (
                ("first_steps_by_shape_total", "The steps among those that ran some request's first tokens on the "
                 "model (a prefill: its prompt, or all it had on its first hop there), by the same shape.", 0, 1.0),
                ("first_step_seconds_by_shape_total", "Time spent in those steps.", 1, 1e-3),
                ("first_step_rows_by_shape_total", "The rows of those steps that were such first runs.", 2, 1.0),
            )),
        )  # fmt: skip
        for attr, counters in by_shape:
            shapes = sorted(
                ((x, key.split("/"), v) for x, s in stats for key, v in getattr(s, attr).items()),
                key=lambda t: (t[0], int(t[1][0]), int(t[1][1]), t[1][2]),
            )
            for name, help_, i, scale in counters:
                metric(name, "counter", help_,
                       [({"model": x, "bs": bs, "q": q, "overlap": o}, v[i] * scale) for x, (bs, q, o), v in shapes])  # fmt: skip
        for name, help_, h in (
            ("time_to_first_token_seconds", "From a request's arrival to its first token.", self.ttft),
            (
                "e2e_request_latency_seconds",
                "From a request's arrival to its end (finished requests).",
                self.e2e,
            ),
        ):
            out.append(f"# HELP {PREFIX}{name} {help_}")
            out.append(f"# TYPE {PREFIX}{name} histogram")
            out.extend(h.lines(PREFIX + name))
        return "\n".join(out) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(v: float) -> str:
    return str(int(v)) if isinstance(v, int) or float(v).is_integer() else repr(float(v))
