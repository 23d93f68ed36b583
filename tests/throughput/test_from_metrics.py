"""`tokenrouter profile --from-metrics`: L_i(b) and p_ij from a server's exact counters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.frontend.metrics import Metrics
from tokenrouter.throughput.from_metrics import MetricsProfileError, non_decreasing, profile_from_metrics
from tokenrouter.throughput.prometheus_format import parse_metrics

ROOT = Path(__file__).resolve().parents[2]
EMPTY_ROUTE = {"nodes": [], "rules": []}
PLAN = {"models": {"slm": {}, "llm": {}}, "policy": {"name": "bern"}, "source": {"sha256": "abc"},
        "routes": {"slm": EMPTY_ROUTE, "llm": EMPTY_ROUTE}}  # fmt: skip


def scrape(
    by_bs: dict[str, dict[int, tuple[int, float]]],
    tokens: dict[str, int],
    hops: dict,
    uptime_ms: float = 0.0,
    slow: dict[str, dict[int, tuple[int, float]]] | None = None,
    thresholds: dict[str, int] | None = None,
    alone: dict[str, dict[int, tuple[int, float]]] | None = None,
    gaps: dict[str, tuple[int, float]] | None = None,
    hops_in: dict[str, tuple[int, float]] | None = None,
) -> str:
    metrics = Metrics(models=["slm", "llm"])
    for model, table in by_bs.items():
        gap, hop = (gaps or {}).get(model, (0, 0.0)), (hops_in or {}).get(model, (0, 0.0))
        step = m.StepStats(
            count=sum(n for n, _ in table.values()),
            busy_ms=sum(ms for _, ms in table.values()),
            uptime_ms=uptime_ms,
            batch_threshold=(thresholds or {}).get(model, 0),
            gaps=gap[0],
            gap_ms=gap[1],
            last_batch_size=1,
            last_ms=1.0,
        )
        tables = m.StepTables(
            by_bs=with_tokens(table),
            slow_by_bs=(slow or {}).get(model, {}),
            alone_by_bs=with_tokens((alone or {}).get(model, {})),
        )
        metrics.on_stats(m.SubserverStats(model=model, step=step, tables=tables, kv=m.KvStats(1, 1),
                                          hops=m.HopStats(*hop)))  # fmt: skip
    metrics.tokens.update(tokens)
    metrics.hops.update(hops)
    return metrics.render(active=0)


def with_tokens(table: dict[int, tuple[int, float]]) -> dict[int, tuple[int, float, int]]:
    """A by-batch-size table of (steps, ms) as `StepTables` holds it: (steps, ms, new tokens), none counted."""
    return {bs: (n, ms, 0) for bs, (n, ms) in table.items()}


def profile_cli(tmp_path: Path, after: str, before: str) -> subprocess.CompletedProcess:
    """`tokenrouter profile examples/bernoulli.tr --from-metrics AFTER --since BEFORE`, which must succeed."""
    (tmp_path / "after.txt").write_text(after)
    (tmp_path / "before.txt").write_text(before)
    r = subprocess.run([sys.executable, "-m", "tokenrouter.cli", "profile", "examples/bernoulli.tr", "--from-metrics",
                        str(tmp_path / "after.txt"), "--since", str(tmp_path / "before.txt"), "-o",
                        str(tmp_path / "p.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r


def test_latencies_and_routing_from_deltas():
    before = scrape(
        {"slm": {1: (10, 100.0)}, "llm": {1: (4, 40.0)}}, {"slm": 10, "llm": 2}, {("slm", "llm"): 2}
    )
    after = scrape(
        {"slm": {1: (110, 400.0), 2: (50, 150.0), 3: (2, 9.0)}, "llm": {1: (104, 840.0)}},
        {"slm": 1010, "llm": 102},
        {("slm", "llm"): 102, ("llm", "slm"): 100},
    )
    prof = profile_from_metrics(PLAN, after, before, min_steps=5)
    # (400-100) ms / 100 steps; bs 3 ran twice only: dropped
    assert [(b, round(ms, 9)) for b, ms in prof.step_ms["slm"].points] == [(1, 3.0), (2, 3.0)]
    assert [(b, round(ms, 9)) for b, ms in prof.step_ms["llm"].points] == [(1, 8.0)]
    assert prof.routing["slm"] == pytest.approx({"slm": 0.9, "llm": 0.1})  # 100 hops over 1000 tokens
    assert prof.routing["llm"] == pytest.approx({"slm": 1.0, "llm": 0.0})
    assert prof.counts["slm"] == {"slm": 900, "llm": 100} and prof.source_sha256 == "abc"
    assert "busy_share" not in prof.workload  # reports without an uptime (servers before it existed)
    assert prof.workload["steps"] == {"slm": {"1": 100, "2": 50}, "llm": {"1": 100}}
    assert "thresholds" not in prof.workload  # servers that do not report B_i


def test_served_thresholds_are_recorded():
    """`tokenrouter_batch_threshold`: the B_i the subservers ran with, as of the later scrape (for the
    co-location term's reference point)."""
    after = scrape({"slm": {1: (100, 200.0)}, "llm": {1: (50, 300.0), 3: (20, 150.0)}}, {"slm": 900, "llm": 100},
                   {("slm", "llm"): 100, ("llm", "slm"): 100}, thresholds={"slm": 1, "llm": 3})  # fmt: skip
    assert 'tokenrouter_batch_threshold{model="llm"} 3' in after
    prof = profile_from_metrics(PLAN, after, min_steps=5)
    assert prof.workload["thresholds"] == {"slm": 1, "llm": 3}
    assert prof.workload["steps"]["llm"] == {"1": 50, "3": 20}


def test_busy_share_over_the_window():
    """Each model's step seconds over its subserver's uptime, both as deltas between the scrapes."""
    before = scrape({"slm": {1: (10, 100.0)}, "llm": {1: (4, 40.0)}}, {"slm": 10, "llm": 2},
                    {("slm", "llm"): 2}, uptime_ms=1000.0)  # fmt: skip
    after = scrape({"slm": {1: (110, 1000.0)}, "llm": {1: (104, 540.0)}}, {"slm": 1010, "llm": 102},
                   {("slm", "llm"): 102, ("llm", "slm"): 100}, uptime_ms=2000.0)  # fmt: skip
    assert 'tokenrouter_uptime_seconds_total{model="slm"} 2' in after
    prof = profile_from_metrics(PLAN, after, before, min_steps=5)
    assert prof.workload["busy_share"] == pytest.approx({"slm": 0.9, "llm": 0.5})
    assert json.loads(json.dumps(prof.to_json()))["workload"]["busy_share"]["llm"] == pytest.approx(0.5)


def test_host_time_between_back_to_back_steps_and_the_delay_of_hops(tmp_path):
    """The subservers count the host time between back-to-back steps (`tokenrouter_step_gap_seconds_total`)
    and the delay of the hops they receive (`tokenrouter_hop_delay_seconds_total`): the profile records their
    means per model where `min_steps` of them ran, and `profile` prints them."""
    hops = {("slm", "llm"): 50, ("llm", "slm"): 50}
    before = scrape({"slm": {1: (10, 20.0)}, "llm": {1: (10, 70.0)}}, {"slm": 10, "llm": 2}, hops,
                    gaps={"slm": (5, 2.0), "llm": (1, 1.0)}, hops_in={"slm": (10, 5.0), "llm": (10, 4.0)})  # fmt: skip
    after = scrape({"slm": {1: (110, 220.0)}, "llm": {1: (110, 770.0)}}, {"slm": 1010, "llm": 102}, hops,
                   gaps={"slm": (105, 32.0), "llm": (4, 3.0)}, hops_in={"slm": (60, 30.0), "llm": (60, 104.0)})  # fmt: skip
    prof = profile_from_metrics(PLAN, after, before, min_steps=5)
    assert prof.workload["gap_ms"] == pytest.approx({"slm": 0.3})  # the llm: 3 gaps, under min_steps
    assert prof.workload["hop_ms"] == pytest.approx({"slm": 0.5, "llm": 2.0})
    r = profile_cli(tmp_path, after, before)
    assert "slm: 0.300 ms of host time between back-to-back steps" in r.stdout
    assert "llm: 2.000 ms of delay per hop received" in r.stdout
    assert "gap_ms" not in profile_from_metrics(PLAN, scrape({"slm": {1: (100, 200.0)}, "llm": {1: (50, 300.0)}},
                                                             {"slm": 900, "llm": 100}, hops)).workload  # fmt: skip


def test_dropping_hops_count_as_decisions():
    """A hop that drops its token writes nothing: the model's decisions are its tokens plus those hops (the
    r2r shape: the small model's hop to the large one drops, the way back keeps)."""
    from tokenrouter.compiler.driver import compile_source

    src = (ROOT / "examples" / "bernoulli.tr").read_text().replace("when uniform() < p -> llm",
                                                                   "when uniform() < p -> llm drop for 1")  # fmt: skip
    src = src.replace("route llm {\n  when uniform() < q -> slm\n}\n", "")
    result = compile_source(src, str(ROOT / "examples" / "bernoulli_drop.tr"))
    assert result.plan is not None, [str(d) for d in result.diagnostics]
    after = scrape({"slm": {1: (100, 200.0)}, "llm": {1: (50, 300.0)}},
                   {"slm": 900, "llm": 100}, {("slm", "llm"): 100, ("llm", "slm"): 100})  # fmt: skip
    prof = profile_from_metrics(result.plan, after)
    # 900 tokens written + 100 dropping hops = 1000 decisions; counted as tokens, p would be 100 / 900
    assert prof.routing["slm"] == pytest.approx({"slm": 0.9, "llm": 0.1})
    assert prof.counts["slm"] == {"slm": 900, "llm": 100}
    # every slm decision dropped its token (an untrained r2r router at a low threshold): still a profile
    everything = scrape({"slm": {1: (100, 200.0)}, "llm": {1: (50, 300.0)}},
                        {"slm": 0, "llm": 100}, {("slm", "llm"): 100, ("llm", "slm"): 100})  # fmt: skip
    assert profile_from_metrics(result.plan, everything).routing["slm"] == pytest.approx(
        {"slm": 0.0, "llm": 1.0}
    )


def test_errors_say_what_is_missing():
    with pytest.raises(MetricsProfileError, match="no tokenrouter_steps_by_batch_total"):
        profile_from_metrics(PLAN, "tokenrouter_requests_total 3\n")
    few = scrape({"slm": {1: (3, 9.0)}, "llm": {1: (9, 9.0)}}, {"slm": 1}, {})
    with pytest.raises(
        MetricsProfileError,
        match=r"model 'slm': no batch size ran 5 times or more \(steps by batch size: \{1: 3\}\)",
    ):
        profile_from_metrics(PLAN, few)


def test_metrics_of_other_models_than_the_plans_are_refused_naming_them():
    """Metrics read from a server of another plan would make a profile of the wrong models."""
    metrics = scrape(
        {"slm": {1: (10, 10.0)}, "llm": {1: (10, 40.0)}}, {"slm": 9, "llm": 1}, {("slm", "llm"): 1}
    )
    other = {**PLAN, "models": {"slm": {}, "big": {}}, "routes": {"slm": EMPTY_ROUTE, "big": EMPTY_ROUTE}}
    with pytest.raises(MetricsProfileError) as err:
        profile_from_metrics(other, metrics)
    assert str(err.value) == (
        "the metrics are not of this plan's models (slm, big): they name 'llm', not in the plan; they have "
        "nothing of the plan's 'big'; were they read from a server of another plan?"
    )
    profile_from_metrics(PLAN, metrics)  # the plan served: a profile


def test_the_routing_digest_keeps_to_what_routes():
    """A plan tuned, moved or with its rules' text reworded routes as before: one digest. Another constant in a
    rule (bernoulli's `p`), another entry or another router's weights: another digest."""
    from tokenrouter.compiler.driver import load_plan
    from tokenrouter.compiler.plan import routing_digest

    plan = load_plan(str(ROOT / "examples" / "bernoulli.tr"))
    digest = routing_digest(plan)
    same = json.loads(json.dumps(plan))
    same["models"]["slm"] |= {"batch": 7, "path": "/elsewhere/py-small"}
    same["serve"]["max_delay_ms"] = 20.0
    same["routes"]["slm"]["rules"][0] |= {"source": "when uniform() < p  -> llm", "line": 99}
    assert routing_digest(same) == digest
    other = json.loads(json.dumps(plan))
    other["routes"]["slm"]["nodes"][1]["value"] = 0.35
    assert routing_digest(other) != digest
    assert routing_digest({**plan, "entry": "llm"}) != digest
    routed = {
        **plan,
        "routers": {"r": {"kind": "mlp", "path": "a", "sha256": "0" * 64, "model": "slm", "inputs": []}},
    }
    moved = {**routed, "routers": {"r": {**routed["routers"]["r"], "path": "b"}}}
    retrained = {**routed, "routers": {"r": {**routed["routers"]["r"], "sha256": "1" * 64}}}
    assert routing_digest(moved) == routing_digest(routed) != routing_digest(retrained)


def test_metrics_of_a_plan_that_routes_otherwise_are_refused():
    """The server publishes its plan's routing digest (`tokenrouter_plan_info`); metrics of the same model names
    routed otherwise are refused, in either scrape; metrics without it (servers before it) are taken."""
    from tokenrouter.compiler.plan import routing_digest

    def published(plan: dict) -> str:
        metrics = Metrics(
            models=["slm", "llm"], plan_info={"policy": "bern", "routing": routing_digest(plan)}
        )
        return "".join(ln + "\n" for ln in metrics.render(active=0).splitlines() if "plan_info" in ln)

    plain = scrape(
        {"slm": {1: (10, 10.0)}, "llm": {1: (10, 40.0)}}, {"slm": 9, "llm": 1}, {("slm", "llm"): 1}
    )
    other = {**PLAN, "entry": "llm"}
    profile_from_metrics(PLAN, plain + published(PLAN))
    profile_from_metrics(PLAN, plain)  # no plan_info: taken as before
    for after, before in ((plain + published(other), None), (plain + published(PLAN), published(other))):
        with pytest.raises(MetricsProfileError, match=r"the metrics are of a server of policy 'bern', which routes "
                           r"otherwise than this plan's 'bern' \(routing digest [0-9a-f]{12}, this plan's [0-9a-f]{12}\)"):  # fmt: skip
            profile_from_metrics(PLAN, after, before)


def test_parse_metrics_labels_and_comments():
    text = '# HELP x y\nx{a="1",b="q\\"z"} 2.5\nbad line here\ny 3\n'
    assert parse_metrics(text) == {("x", (("a", "1"), ("b", 'q\\"z'))): 2.5, ("y", ()): 3.0}


def requests_scrape(visited: dict[str, int], ended: int, hops_per_request: int) -> str:
    """A scrape of `ended` requests of 100 tokens each, `hops_per_request` hops into llm (and back) per request
    on average, and per model the requests it wrote a token of."""
    hops, k = ended * hops_per_request, ended  # steps grow with the requests (two scrapes give deltas)
    text = scrape({"slm": {1: (10 * k, 20.0 * k), 4: (10 * k, 21.0 * k)},
                   "llm": {1: (6 * k, 36.0 * k), 2: (4 * k, 24.8 * k), 4: (4 * k, 26.0 * k)}},
                  {"slm": 100 * ended - hops, "llm": hops}, {("slm", "llm"): hops, ("llm", "slm"): hops})  # fmt: skip
    metrics = Metrics(models=["slm", "llm"])
    for _ in range(ended):
        metrics.e2e.observe(1.0)
    metrics.visits.update(visited)
    return text + "".join(ln + "\n" for ln in metrics.render(active=0).splitlines()
                          if ln.startswith(("tokenrouter_requests_visiting", "tokenrouter_e2e_request_latency_seconds_count")))  # fmt: skip


def test_the_requests_each_model_reached_are_recorded():
    """`workload.requests`: the requests that ended in the window and, per model, how many it wrote a token of
    (`tokenrouter_requests_visiting_total` over `tokenrouter_e2e_request_latency_seconds_count`, as deltas)."""
    before = requests_scrape({"slm": 2, "llm": 1}, 2, 5)
    after = requests_scrape({"slm": 18, "llm": 4}, 18, 5)
    assert 'tokenrouter_requests_visiting_total{model="llm"} 4' in after
    prof = profile_from_metrics(PLAN, after, before, min_steps=5)
    assert prof.workload["requests"] == {"ended": 16, "visited": {"slm": 16, "llm": 3}}
    # servers before the counter: no record
    old = scrape({"slm": {1: (100, 200.0)}, "llm": {1: (50, 300.0)}}, {"slm": 900, "llm": 100},
                 {("slm", "llm"): 100, ("llm", "slm"): 100})  # fmt: skip
    assert "requests" not in profile_from_metrics(PLAN, old, min_steps=5).workload


def test_tune_warns_where_routing_concentrates_in_a_few_requests(tmp_path):
    """A served r2r run at N = 4 on the H200 (run125.tar.gz): 13 of 16 requests sent the 8B nothing, and the
    tuned B_llm = 2 served 0.82x eager, each hop waiting for the timeout. Where many requests never reached a
    model whose chosen B_i > 1, while its hops per request would have reached nearly all of alike requests,
    `tune` warns; where the requests reached it as alike ones would, it does not."""
    cli = [sys.executable, "-m", "tokenrouter.cli"]
    stdlib = "tokenrouter/stdlib/bernoulli.tr"  # both thresholds `auto`, max_delay_ms 5
    # a timeout the batches fill within, so that tune keeps the chain's B* (`timeout_check`)
    patient = tmp_path / "bernoulli.tr"
    patient.write_text((ROOT / stdlib).read_text().replace("max_delay_ms: 5", "max_delay_ms: 1000"))

    def tune(visited_llm: int, ended: int = 16, policy: str = str(patient)) -> dict:
        (tmp_path / "after.txt").write_text(requests_scrape({"slm": ended, "llm": visited_llm}, ended, 30))
        r = subprocess.run([*cli, "profile", policy, "--from-metrics", str(tmp_path / "after.txt"),
                            "-o", str(tmp_path / "p.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert f"  llm: wrote tokens of {visited_llm} of the {ended} requests that ended" in r.stdout
        r = subprocess.run([*cli, "tune", policy, "--profile", str(tmp_path / "p.json"), "-n", "4",
                            "--json", "-o", str(tmp_path / "t.plan")], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["tuning"] | {"stderr": r.stderr}

    # with the stdlib's 5 ms the chain's B_llm > 1 would start most batches on the timeout: simulated with
    # it, the plan's setting serves better and is kept, as that run's eager B_llm = 1 served better
    kept = tune(3, policy=stdlib)
    assert kept["timeout_check"]["kept"] == "current" and kept["result"]["best"]["llm"] == 1
    tuning = tune(3)
    assert tuning["result"]["best"]["llm"] > 1  # the latencies make batching the llm pay
    (line,) = [w for w in tuning.get("warnings", []) if "never reached" in w]
    b = tuning["result"]["best"]["llm"]
    assert line.startswith(f"B_llm = {b}: 13 of the profile's 16 requests never reached llm, where 16 requests "
                           "alike, with its 30.0 hops per request, would leave about 0.0")  # fmt: skip
    assert f"warning: {line}" in tuning["stderr"]
    # simulate at those thresholds says the same where it assumes alike requests, not where it replays requests
    sim = [*cli, "simulate", str(tmp_path / "t.plan"), "--profile", str(tmp_path / "p.json")]
    r = subprocess.run(sim, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"warning: {line}" in r.stderr, r.stderr
    report = {"spec": {"output_len": 100}, "per_request": [{"ok": True, "tokens_per_model": {"slm": 100, "llm": 0}}] * 3
              + [{"ok": True, "tokens_per_model": {"slm": 40, "llm": 60}, "hops": 120}]}  # fmt: skip
    (tmp_path / "bench.json").write_text(json.dumps(report))
    r = subprocess.run([*sim, "--requests", str(tmp_path / "bench.json")], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "never reached" not in r.stderr
    assert not [w for w in tune(16).get("warnings", []) if "never reached" in w]  # every request reached it
    assert not [w for w in tune(14).get("warnings", []) if "never reached" in w]  # 2 missing: chance


def test_concentration_warnings_only_for_batched_models_off_the_entry():
    from tokenrouter.throughput.plan_inputs import concentration_warnings, system_from_plan
    from tokenrouter.throughput.policy import policy_routing

    prof = profile_from_metrics(PLAN, requests_scrape({"slm": 16, "llm": 2}, 16, 30), min_steps=5)
    plan = {**PLAN, "entry": "slm", "serve": {"concurrency": 4}}
    plan["models"] = {"slm": {"batch": "auto"}, "llm": {"batch": "auto"}}
    assert policy_routing(plan).keep is not None
    system = system_from_plan(plan, profile=prof)
    assert system.requests == {
        "ended": 16,
        "visited": {"slm": 16, "llm": 2},
        "hops_in": {"llm": 480, "slm": 480},
    }
    warn = lambda b: concentration_warnings(system, b)  # noqa: E731
    assert len(warn((1, 2))) == 1 and warn((1, 1)) == [] and warn((3, 1)) == []  # the entry is never warned
    system.requests = {}  # a profile without the counts (older servers) or routing given by hand
    assert warn((1, 2)) == []
    # a hand-edited profile with malformed counts: a clear error, not a traceback
    from tokenrouter.throughput.plan_inputs import ThroughputInputError

    for bad in ({"ended": "16", "visited": {"llm": 2}}, {"ended": 16, "visited": ["llm"]}, [16]):
        prof.workload["requests"] = bad
        with pytest.raises(ThroughputInputError, match="workload.requests"):
            system_from_plan(plan, profile=prof)


def test_cli_from_file_then_tune(tmp_path):
    after = scrape({"slm": {1: (100, 200.0), 4: (100, 300.0)}, "llm": {1: (50, 300.0)}},
                   {"slm": 1000, "llm": 50}, {("slm", "llm"): 50, ("llm", "slm"): 50})  # fmt: skip
    (tmp_path / "after.txt").write_text(after)
    cli = [sys.executable, "-m", "tokenrouter.cli"]
    out = tmp_path / "p.json"
    r = subprocess.run([*cli, "profile", "examples/bernoulli.tr", "--from-metrics", str(tmp_path / "after.txt"),
                        "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "slm: step b=1 2.000 ms, b=4 3.000 ms" in r.stdout
    assert json.loads(out.read_text())["routing"]["slm"]["llm"] == pytest.approx(0.05)
    r = subprocess.run([*cli, "tune", "examples/bernoulli.tr", "--profile", str(out), "-n", "4", "--json",
                        "-o", str(tmp_path / "t.plan")], cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tuning"]["step_ms"]["llm"] == [[1, 6.0]]
    r = subprocess.run([*cli, "profile", "examples/bernoulli.tr", "--from-metrics", str(tmp_path / "nope.txt")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode != 0 and "cannot read metrics file" in r.stderr and "Traceback" not in r.stderr


def test_stalled_steps_are_left_out_of_the_latencies():
    """A stall the subserver counted (one 1.1 s step among 300 of 6.7 ms, as on the H200) leaves L(b); the
    profile says how many were left out."""
    before = scrape(
        {"slm": {1: (10, 20.0)}, "llm": {1: (10, 67.0)}}, {"slm": 10, "llm": 2}, {("slm", "llm"): 2}
    )
    after = scrape(
        {"slm": {1: (310, 620.0)}, "llm": {1: (310, 67.0 + 299 * 6.7 + 1100.0), 2: (6, 42.0)}},
        {"slm": 1010, "llm": 102},
        {("slm", "llm"): 102, ("llm", "slm"): 100},
        slow={"llm": {1: (1, 1100.0)}},
    )
    prof = profile_from_metrics(PLAN, after, before, min_steps=5)
    assert dict(prof.step_ms["llm"].points)[1] == pytest.approx(6.7)  # 10.4 ms with the stall in
    assert dict(prof.step_ms["llm"].points)[2] == pytest.approx(7.0)
    assert prof.workload["stalls"] == {"llm": {1: 1}}
    assert "stalls" not in profile_from_metrics(PLAN, before, None, min_steps=5).workload


def test_steps_alone_and_beside_from_the_busy_board_counters():
    """Subservers sharing a GPU count the steps they started while the others idled
    (`tokenrouter_alone_steps_by_batch_total`): the profile keeps every step in `step_ms` and splits them into
    `alone_ms` and `beside_ms` where each kind ran `min_steps` times; a model with one kind only gets neither."""
    before = scrape({"slm": {1: (10, 20.0)}, "llm": {1: (10, 70.0)}}, {"slm": 10, "llm": 2}, {("slm", "llm"): 2},
                    alone={"slm": {1: (2, 3.0)}})  # fmt: skip
    # slm at b = 1: 100 steps in the window, 40 alone at 1.5 ms, 60 beside at 2.5 ms; at b = 8: all 20 alone
    after = scrape(
        {"slm": {1: (110, 20.0 + 60.0 + 150.0), 8: (20, 32.0)}, "llm": {1: (110, 770.0)}},
        {"slm": 1010, "llm": 102},
        {("slm", "llm"): 102, ("llm", "slm"): 100},
        alone={"slm": {1: (42, 63.0), 8: (20, 32.0)}, "llm": {1: (3, 20.0)}},
    )
    assert 'tokenrouter_alone_steps_by_batch_total{model="slm",bs="8"} 20' in after
    prof = profile_from_metrics(PLAN, after, before, min_steps=5)
    assert dict(prof.step_ms["slm"].points) == pytest.approx({1: 2.1, 8: 1.6})
    assert dict(prof.alone_ms["slm"].points) == pytest.approx({1: 1.5, 8: 1.6})
    assert dict(prof.beside_ms["slm"].points) == pytest.approx({1: 2.5})  # b = 8 never ran beside
    assert "llm" not in prof.alone_ms  # 3 steps alone: under min_steps
    assert prof.workload["steps_by_state"] == {"slm": {"alone": {"1": 40, "8": 20}, "beside": {"1": 60}}}
    back = json.loads(json.dumps(prof.to_json()))
    assert back["beside_ms"] == {"slm": {"1": pytest.approx(2.5)}}
    # servers without a busy board: no split
    plain = profile_from_metrics(PLAN, scrape({"slm": {1: (100, 200.0)}, "llm": {1: (50, 300.0)}},
                                              {"slm": 900, "llm": 100}, {("slm", "llm"): 100, ("llm", "slm"): 100}))  # fmt: skip
    assert plain.alone_ms == {} and "steps_by_state" not in plain.workload


def test_latencies_alone_are_fitted_non_decreasing_in_the_batch_size(tmp_path):
    """A batch size whose steps alone took longer on their mean than a larger one's is pooled with it, each
    mean weighted by its steps (a second profile on the H200: the 0.6B at 2-4 rows alone, 100, 56 and 430 steps
    at 1.59, 1.74 and 1.24 ms); `fit_alone=False` keeps the means as measured."""
    assert non_decreasing([(1, 1.0, 10), (2, 2.0, 10)]) == ([(1, 1.0), (2, 2.0)], [])
    fitted, pooled = non_decreasing(
        [(1, 1.07, 33), (2, 1.59, 100), (3, 1.74, 56), (4, 1.24, 430), (5, 1.39, 308)]
    )
    pool = (100 * 1.59 + 56 * 1.74 + 430 * 1.24) / 586
    assert [b for b, _ in fitted] == [1, 2, 3, 4, 5]
    assert [ms for _, ms in fitted] == pytest.approx([1.07, pool, pool, pool, 1.39])
    assert pooled == [[2, 3, 4]]
    before = scrape({"slm": {1: (1, 1.0)}, "llm": {1: (1, 7.0)}}, {"slm": 1, "llm": 1}, {})
    steps = {"slm": {2: (40, 80.0), 3: (30, 60.0), 4: (30, 45.0)}, "llm": {2: (40, 280.0)}}
    after = scrape(steps, {"slm": 1000, "llm": 200}, {("slm", "llm"): 100, ("llm", "slm"): 100},
                   alone={"slm": {2: (20, 30.0), 3: (10, 20.0), 4: (30, 45.0)}})  # 1.5, 2.0, 1.5 ms  # fmt: skip
    prof = profile_from_metrics(PLAN, after, before, min_steps=5)
    assert dict(prof.alone_ms["slm"].points) == pytest.approx({2: 1.5, 3: 1.625, 4: 1.625})
    assert prof.workload["alone_fit"] == "non-decreasing"
    assert prof.workload["steps_by_state"]["slm"]["alone_pooled"] == [[3, 4]]
    assert dict(prof.step_ms["slm"].points) == pytest.approx(
        {2: 2.0, 3: 2.0, 4: 1.5}
    )  # every step: as measured
    raw = profile_from_metrics(PLAN, after, before, min_steps=5, fit_alone=False)
    assert dict(raw.alone_ms["slm"].points) == pytest.approx({2: 1.5, 3: 2.0, 4: 1.5})
    assert "alone_fit" not in raw.workload and "alone_pooled" not in raw.workload["steps_by_state"]["slm"]
    r = profile_cli(tmp_path, after, before)
    assert "slm: alone at batch sizes 3-4 pooled into one mean" in r.stdout


def test_sparse_alone_steps_scale_the_latencies_beside(tmp_path):
    """Where no batch size ran alone `min_steps` times but all the alone steps together did (an eager
    profile's 0.6B, alone only while the 8B holds no request), the latencies alone are those beside, scaled by
    the ratio the alone steps show: their time over what the same steps take beside."""
    before = scrape({"slm": {7: (0, 0.0), 8: (0, 0.0)}, "llm": {1: (10, 70.0)}}, {"slm": 10, "llm": 2},
                    {("slm", "llm"): 2})  # fmt: skip
    after = scrape(
        {"slm": {2: (50, 125.0), 7: (20, 52.0), 8: (4, 6.4)}, "llm": {1: (110, 770.0)}},
        {"slm": 1010, "llm": 102},
        {("slm", "llm"): 102, ("llm", "slm"): 100},
        alone={
            "slm": {7: (3, 4.5), 8: (4, 6.4)},
            "llm": {1: (4, 20.0)},
        },  # 7 alone in all; llm's 4 are too few
    )
    prof = profile_from_metrics(PLAN, after, before, min_steps=5)
    beside = {2: 2.5, 7: 47.5 / 17}  # b = 8: no step beside; it takes b = 7's latency
    assert dict(prof.beside_ms["slm"].points) == pytest.approx(beside)
    ratio = (4.5 + 6.4) / (7 * beside[7])
    assert dict(prof.alone_ms["slm"].points) == pytest.approx({b: ms * ratio for b, ms in beside.items()})
    assert "llm" not in prof.alone_ms
    assert prof.workload["steps_by_state"]["slm"] == {
        "alone": {"7": 3, "8": 4},
        "beside": {"2": 50, "7": 17},
        "alone_scaled_by": pytest.approx(ratio),
    }
    r = profile_cli(tmp_path, after, before)
    assert f"slm: alone = beside × {ratio:.3f}, the ratio of its 7 steps alone" in r.stdout


def test_the_metrics_layout_version_picks_how_prefills_are_read():
    """The frontend exports the layout version the reader knows; a version 2 export is read by its first-run
    counters even where no step ran a request's first tokens (no prefills: the long steps stay in their batch
    size's latency), an export without the gauge as version 1 (by shape), and a newer one is refused."""
    from tokenrouter.runtime.frontend import metrics as frontend
    from tokenrouter.throughput import prometheus_format as from_metrics

    assert frontend.METRICS_SCHEMA == from_metrics.METRICS_SCHEMA
    metrics = Metrics(models=["slm", "llm"])
    for model in ("slm", "llm"):
        shapes = {"1/1/untracked": (10, 20.0, 10), "1/128/untracked": (10, 180.0, 1280)}
        metrics.on_stats(m.SubserverStats(model=model, step=m.StepStats(count=20, busy_ms=200.0),
                                          tables=m.StepTables(by_bs={1: (20, 200.0, 0)}, by_shape=shapes)))  # fmt: skip
    metrics.tokens.update({"slm": 18, "llm": 18})
    metrics.hops.update({("slm", "llm"): 1, ("llm", "slm"): 1})
    text = metrics.render(active=0)
    assert f"tokenrouter_metrics_schema {from_metrics.METRICS_SCHEMA}" in text.splitlines()
    v2 = profile_from_metrics(PLAN, text, min_steps=5)
    assert v2.workload["prefill_steps"] == "first runs" and v2.prefill == {}
    assert dict(v2.step_ms["llm"].points) == pytest.approx({1: 10.0})
    old = "\n".join(line for line in text.splitlines() if "metrics_schema" not in line)
    v1 = profile_from_metrics(PLAN, old, min_steps=5)
    assert v1.workload["prefill_steps"] == "longest row > 64" and v1.prefill["llm"]["steps"] == 10
    assert dict(v1.step_ms["llm"].points) == pytest.approx({1: 2.0})
    newer = text.replace("tokenrouter_metrics_schema 2", "tokenrouter_metrics_schema 3")
    with pytest.raises(MetricsProfileError, match=r"layout version 3 .*versions 1 to 2"):
        profile_from_metrics(PLAN, newer, min_steps=5)
