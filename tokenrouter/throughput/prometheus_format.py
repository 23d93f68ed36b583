"""The counters of a server's Prometheus text (`GET /metrics`, or a saved copy) as `Counters`: how
`profile --from-metrics` reads servers older than the JSON stats document (`stats_format.py`), and copies saved
from them.

The text says its layout's version (`tokenrouter_metrics_schema`; an export without it is version 1). From
version 2 the servers count the steps that ran some request's first tokens on a model
(`tokenrouter_first_steps_by_shape_total`); a version 1 export is read by what it has.
"""

from __future__ import annotations

import re

from tokenrouter.throughput.stats_format import Counters, MetricsProfileError, ModelCounters

# the newest layout of the metrics this reader knows (`tokenrouter_metrics_schema`); 1: exports without the gauge
METRICS_SCHEMA = 2

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# per-model series -> (the `ModelCounters` table or row it feeds, the column)
_BY_BS = {
    "tokenrouter_steps_by_batch_total": ("by_bs", 0),
    "tokenrouter_step_seconds_by_batch_total": ("by_bs", 1),
    "tokenrouter_slow_steps_by_batch_total": ("slow_by_bs", 0),
    "tokenrouter_slow_step_seconds_by_batch_total": ("slow_by_bs", 1),
    "tokenrouter_alone_steps_by_batch_total": ("alone_by_bs", 0),
    "tokenrouter_alone_step_seconds_by_batch_total": ("alone_by_bs", 1),
}
_BY_SHAPE = {
    "tokenrouter_steps_by_shape_total": ("by_shape", 0),
    "tokenrouter_step_seconds_by_shape_total": ("by_shape", 1),
    "tokenrouter_step_tokens_by_shape_total": ("by_shape", 2),
    "tokenrouter_first_steps_by_shape_total": ("first_by_shape", 0),
    "tokenrouter_first_step_seconds_by_shape_total": ("first_by_shape", 1),
    "tokenrouter_first_step_rows_by_shape_total": ("first_by_shape", 2),
}
_ROWS = {
    "tokenrouter_step_seconds_total": ("busy", 0),
    "tokenrouter_uptime_seconds_total": ("busy", 1),
    "tokenrouter_step_gaps_total": ("gaps", 0),
    "tokenrouter_step_gap_seconds_total": ("gaps", 1),
    "tokenrouter_hops_in_total": ("hops_in", 0),
    "tokenrouter_hop_delay_seconds_total": ("hops_in", 1),
}

Parsed = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str) -> Parsed:
    """Prometheus text → {(name, sorted labels): value}; comments and unparsable lines are skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        found = _SAMPLE.match(line)
        if not found:
            continue
        name, labels, value = found.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        out[(name, tuple(sorted(_LABEL.findall(labels or ""))))] = v
    return out


def metrics_schema(metrics: Parsed) -> int:
    """The layout version of a parsed export (`tokenrouter_metrics_schema`, 1 where it has none), refused where
    it is newer than this reader knows."""
    version = metrics.get(("tokenrouter_metrics_schema", ()), 1.0)
    if version != int(version) or not 1 <= version <= METRICS_SCHEMA:
        raise MetricsProfileError(
            f"the metrics are of layout version {version:g} (tokenrouter_metrics_schema), which this tokenrouter "
            f"does not read (versions 1 to {METRICS_SCHEMA}): read them with the tokenrouter of that server"
        )
    return int(version)


def counters_from_prometheus(text: str) -> Counters:
    """The counters of a Prometheus export of a tokenrouter server."""
    parsed = parse_metrics(text)
    first = any(
        name == "tokenrouter_first_steps_by_shape_total" for name, _ in parsed
    )  # version 1, counting them
    out = Counters(counts_first=metrics_schema(parsed) >= 2 or first)
    for (name, labels), value in parsed.items():
        if not name.startswith("tokenrouter_"):
            continue
        lab = dict(labels)
        out.named |= {v for k, v in labels if k in ("model", "from", "to")}
        if "model" in lab and (name in _BY_BS or name in _BY_SHAPE or name in _ROWS):
            _model_sample(out.models.setdefault(lab["model"], ModelCounters()), name, lab, value)
        else:
            _server_sample(out, name, lab, value)
    return out


def _model_sample(c: ModelCounters, name: str, lab: dict[str, str], value: float) -> None:
    if name in _BY_BS:
        table, i = _BY_BS[name]
        getattr(c, table).setdefault(int(lab["bs"]), [0.0, 0.0])[i] = value
    elif name in _BY_SHAPE:
        table, i = _BY_SHAPE[name]
        shape = (int(lab["bs"]), int(lab["q"]), lab["overlap"])
        getattr(c, table).setdefault(shape, [0.0, 0.0, 0.0])[i] = value
    else:
        row, i = _ROWS[name]
        getattr(c, row)[i] = value


def _server_sample(out: Counters, name: str, lab: dict[str, str], value: float) -> None:
    if name == "tokenrouter_generation_tokens_total":
        out.tokens[lab["model"]] = value
    elif name == "tokenrouter_hops_total":
        out.hops[(lab["from"], lab["to"])] = value
    elif name == "tokenrouter_requests_visiting_total":
        out.visits[lab["model"]] = value
    elif name == "tokenrouter_e2e_request_latency_seconds_count":
        out.ended = value
    elif name == "tokenrouter_batch_threshold":
        out.models.setdefault(lab["model"], ModelCounters()).threshold = int(value)
    elif name == "tokenrouter_plan_info":
        out.plan = lab
