"""`profile --from-metrics` over the JSON stats document (`GET /v1/stats`): the same profile as from the same
server's Prometheus text, versioned, and refused with a clear message where it is not one this reader knows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokenrouter.compiler.plan import routing_digest
from tokenrouter.runtime import messages as m
from tokenrouter.runtime.frontend.config import FrontendArgs
from tokenrouter.runtime.frontend.metrics import STATS_SCHEMA_VERSION, Metrics
from tokenrouter.runtime.frontend.playground import stats
from tokenrouter.throughput import stats_format
from tokenrouter.throughput.from_metrics import MetricsProfileError, profile_from_metrics, read_counters

ROOT = Path(__file__).resolve().parents[2]
EMPTY_ROUTE = {"nodes": [], "rules": []}
PLAN = {"models": {"slm": {}, "llm": {}}, "policy": {"name": "bern"}, "source": {"sha256": "abc"},
        "routes": {"slm": EMPTY_ROUTE, "llm": EMPTY_ROUTE}}  # fmt: skip
ARGS = FrontendArgs(policy="bern", entry="slm", models=["slm", "llm"], model_dir=".",
                    endpoints={"frontend": "x", "launcher": "y", "subservers": {"slm": "1", "llm": "2"}})  # fmt: skip


def served(k: int) -> Metrics:
    """A server's metrics after `k` rounds: steps by batch size with a stall, steps alone, shapes with prefills and
    first runs, host gaps, hop delays, thresholds, uptime, ended requests and visits."""
    mt = Metrics(models=["slm", "llm"])
    mt.plan_info = {"policy": "bern", "routing": routing_digest(PLAN)}
    for x, bs, ms in (("slm", 2, 2.0), ("llm", 1, 6.0)):
        step = m.StepStats(
            count=110 * k,
            busy_ms=ms * 110 * k + 900.0 * k,
            uptime_ms=4000.0 * k,
            batch_threshold=bs,
            gaps=20 * k,
            gap_ms=3.0 * k,
        )
        tables = m.StepTables(
            by_bs={bs: (110 * k, ms * 100 * k + 200.0 * k + 900.0 * k, 400 * k), 3: (3 * k, 30.0 * k, 9 * k)},
            slow_by_bs={bs: (k, 900.0 * k)},
            alone_by_bs={bs: (40 * k, ms * 0.8 * 30 * k + 100.0 * k, 80 * k)},
            by_shape={
                f"{bs}/1/overlapped": (70 * k, ms * 70 * k, 70 * k),
                f"{bs}/1/alone": (30 * k, ms * 24 * k, 30 * k),
                f"{bs}/4096/alone": (10 * k, 100.0 * k, 300 * k),
                f"{bs}/4096/stall": (k, 900.0 * k, 30 * k),
            },
            first_by_shape={
                f"{bs}/4096/alone": (10 * k, 100.0 * k, 10 * k),
                f"{bs}/4096/stall": (k, 900.0 * k, k),
            },
        )
        mt.on_stats(m.SubserverStats(x, step=step, tables=tables, hops=m.HopStats(30 * k, 12.0 * k)))
    mt.tokens.update({"slm": 900 * k, "llm": 100 * k})
    mt.hops.update({("slm", "llm"): 100 * k, ("llm", "slm"): 100 * k})
    mt.visits.update({"slm": 10 * k, "llm": 5 * k})
    for _ in range(10 * k):
        mt.e2e.observe(1.0)
    return mt


def document(k: int) -> str:
    """/v1/stats of `served(k)`, as the server sends it."""
    return json.dumps(stats(served(k), 0, ARGS))


def same(a, b) -> None:
    ja, jb = a.to_json(), b.to_json()
    ja.pop("created")
    jb.pop("created")
    assert ja == jb


@pytest.mark.parametrize("fit_alone", [True, False])
@pytest.mark.parametrize("prefill_above", [64, None])
def test_the_stats_document_makes_the_profile_the_prometheus_text_makes(fit_alone, prefill_above):
    kw = {"min_steps": 5, "fit_alone": fit_alone, "prefill_above": prefill_above}
    text = profile_from_metrics(PLAN, served(3).render(active=0), served(1).render(active=0), **kw)
    doc = profile_from_metrics(PLAN, document(3), document(1), **kw)
    same(doc, text)
    assert doc.workload["requests"] == {"ended": 20, "visited": {"slm": 20, "llm": 10}}
    assert doc.workload["stalls"] == {"llm": {1: 2}, "slm": {2: 2}}
    assert doc.workload["thresholds"] == {"slm": 2, "llm": 1}
    assert doc.workload["gap_ms"]["slm"] == pytest.approx(0.15)
    if prefill_above is not None:
        assert doc.workload["prefill_steps"] == "first runs" and doc.prefill["llm"]["steps"] == 20
    parsed = profile_from_metrics(PLAN, json.loads(document(3)), json.loads(document(1)), **kw)  # as dicts
    same(parsed, doc)


def test_the_stats_document_is_versioned():
    """The runtime writes the version the reader knows; a document of another version, or without one, or not
    a stats document at all, is refused with what to do."""
    assert STATS_SCHEMA_VERSION == stats_format.STATS_SCHEMA_VERSION
    doc = json.loads(document(1))
    assert doc["schema_version"] == STATS_SCHEMA_VERSION and doc["object"] == "stats"
    with pytest.raises(MetricsProfileError, match=r"schema_version 2; this tokenrouter reads version 1: read it "
                                                  r"with the tokenrouter of that server"):  # fmt: skip
        profile_from_metrics(PLAN, {**doc, "schema_version": 2})
    with pytest.raises(MetricsProfileError, match="has no schema_version"):
        read_counters({k: v for k, v in doc.items() if k != "schema_version"})
    with pytest.raises(MetricsProfileError, match="not a tokenrouter stats document"):
        read_counters('{"object": "list", "data": []}')
    with pytest.raises(MetricsProfileError, match="not a JSON stats document"):
        read_counters('{"object": "stats",')
    broken = {**doc, "subserver_stats": {"slm": {"step": {}}}}
    with pytest.raises(MetricsProfileError, match=r"malformed stats document \(schema_version 1\): KeyError"):
        read_counters(broken)


def test_a_stats_document_of_another_plan_is_refused():
    doc = json.loads(document(3))
    with pytest.raises(MetricsProfileError, match="which routes otherwise than this plan's"):
        profile_from_metrics(PLAN, {**doc, "plan": {"policy": "other", "routing": "0" * 64}})
    renamed = {**doc, "models": ["slm", "xlm"], "generation_tokens": {"slm": 1, "xlm": 1}}
    with pytest.raises(MetricsProfileError, match=r"they name 'xlm', not in the plan"):
        profile_from_metrics(PLAN, renamed)


def test_profile_from_saved_stats_documents(tmp_path):
    """`tokenrouter profile PLAN --from-metrics AFTER.json --since BEFORE.json`: saved /v1/stats documents; one of
    an unknown version is refused with a message, not a traceback."""

    def profile(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tokenrouter.cli", "profile", "examples/bernoulli.tr", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip

    for name, k in (("before.json", 1), ("after.json", 3)):  # of a server that does not publish its plan
        (tmp_path / name).write_text(json.dumps({**json.loads(document(k)), "plan": {}}))
    out = tmp_path / "prof.json"
    r = profile(
        "--from-metrics",
        str(tmp_path / "after.json"),
        "--since",
        str(tmp_path / "before.json"),
        "-o",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    prof = json.loads(out.read_text())
    assert prof["workload"]["prefill_steps"] == "first runs" and set(prof["step_ms"]) == {"slm", "llm"}
    (tmp_path / "newer.json").write_text(json.dumps({**json.loads(document(3)), "schema_version": 9}))
    r = profile("--from-metrics", str(tmp_path / "newer.json"), "-o", str(out))
    assert r.returncode != 0 and "schema_version 9" in r.stderr and "Traceback" not in r.stderr
