"""Frontend metrics, rendered by hand in the Prometheus text exposition format (no client library).

Counters are updated by the request manager (from StepOutputs and request lifecycles); per-subserver gauges
are the latest `SubserverStats` each subserver sent.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tokenrouter.runtime import messages as m

PREFIX = "tokenrouter_"


@dataclass(slots=True)
class Metrics:
    models: list[str]
    requests_total: int = 0
    requests_finished: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by reason
    prompt_tokens: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by model
    hops: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))  # (from, to)
    stats: dict[str, m.SubserverStats] = field(default_factory=dict)
    step_ms_sum: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    step_count: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def on_stats(self, s: m.SubserverStats) -> None:
        prev = self.stats.get(s.model)
        new_steps = s.steps - (prev.steps if prev else 0)
        if new_steps > 0:  # approximate the latency sum by the last step's latency for the steps in between
            self.step_ms_sum[s.model] += s.last_step_ms * new_steps
            self.step_count[s.model] += new_steps
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
        gauges = [
            ("queue_waiting", "Requests waiting to be scheduled on a subserver.", "waiting"),
            ("queue_running", "Requests runnable on a subserver.", "running"),
            ("queue_pending", "Requests held on a subserver while another model writes.", "pending"),
            ("batch_size", "Requests in the subserver's last step.", "last_batch_size"),
            ("kv_pages_total", "Pages of the subserver's KV pool.", "kv_pages_total"),
            ("kv_pages_free", "Free pages of the subserver's KV pool.", "kv_pages_free"),
        ]
        for name, help_, attr in gauges:
            metric(
                name,
                "gauge",
                help_,
                [({"model": x}, getattr(s, attr)) for x, s in sorted(self.stats.items())],
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
        metric(
            "step_latency_seconds_mean",
            "gauge",
            "Mean step latency since start (each stats report weighs its last step by the steps since the previous report).",
            [
                ({"model": x}, self.step_ms_sum[x] / 1000.0 / n)
                for x, n in sorted(self.step_count.items())
                if n
            ],
        )
        return "\n".join(out) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(v: float) -> str:
    return str(int(v)) if isinstance(v, int) or float(v).is_integer() else repr(float(v))
