"""Prompt prefills priced apart: `from_metrics` takes the steps whose longest row ran more than 64 new tokens out
of the batch sizes' latencies, the chain spreads their cost over each model's steps (`prefill.py`), and the
simulator adds it to a request's first step at a model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.frontend.metrics import Metrics
from tokenrouter.throughput.dtmc import analyze
from tokenrouter.throughput.from_metrics import profile_from_metrics
from tokenrouter.throughput.inputs import PrefillCost, StepLatency, SystemInputs, make_inputs
from tokenrouter.throughput.plan_inputs import with_prefill
from tokenrouter.throughput.profile_format import ProfileError, read_profile, write_profile
from tokenrouter.throughput.simulate import SimConfig, simulate
from tokenrouter.throughput.workload import with_visit_costs

ROOT = Path(__file__).resolve().parents[2]
PLAN = {"models": {"slm": {}, "llm": {}}, "policy": {"name": "bern"}, "source": {"sha256": "abc"},
        "routes": {"slm": {"nodes": [], "rules": []}, "llm": {"nodes": [], "rules": []}}}  # fmt: skip


def scrape(scale: int) -> str:
    """A server's /metrics after `scale` rounds of 10 requests of 100 tokens: per round the slm ran 200 decode
    steps of 2 ms at 2 rows (100 of them alone) and 10 prompt prefills of 20 ms (alone, 4,096-token rows); the
    llm 100 steps of 6 ms at 1 row, 5 first visits at 1 row taking 86 ms and one stall; 5 requests reached llm.
    A server of metrics layout 1 that does not count the steps that ran a request's first tokens."""
    k = scale
    shapes = {
        "slm": {"2/1/overlapped": (100 * k, 200.0 * k, 200 * k), "2/1/alone": (100 * k, 200.0 * k, 200 * k),
                "2/4096/alone": (10 * k, 200.0 * k, 30000 * k)},
        "llm": {"1/1/untracked": (100 * k, 600.0 * k, 100 * k), "1/4096/untracked": (5 * k, 430.0 * k, 15000 * k),
                "1/4096/stall": (k, 900.0 * k, 3000 * k)},
    }  # fmt: skip
    by_bs = {"slm": {2: (210 * k, 600.0 * k)}, "llm": {1: (106 * k, 1930.0 * k)}}
    alone = {"slm": {2: (110 * k, 400.0 * k)}, "llm": {}}
    slow = {"slm": {}, "llm": {1: (k, 900.0 * k)}}
    text = render(k, shapes, {}, by_bs, alone, slow, {"slm": 10 * k, "llm": 5 * k})
    return "\n".join(line for line in text.splitlines() if "tokenrouter_metrics_schema" not in line)


def render(k: int, shapes: dict, firsts: dict, by_bs: dict, alone: dict, slow: dict, visits: dict) -> str:
    """/metrics of two subservers with these counters, 10 × `k` ended requests of 100 tokens each."""
    metrics = Metrics(models=["slm", "llm"])
    for model in ("slm", "llm"):
        step = m.StepStats(
            count=sum(n for n, _ in by_bs[model].values()),
            busy_ms=sum(ms for _, ms in by_bs[model].values()),
            last_batch_size=1,
            last_ms=1.0,
        )
        tables = m.StepTables(
            by_bs={bs: (n, ms, 0) for bs, (n, ms) in by_bs[model].items()},
            slow_by_bs=slow[model],
            alone_by_bs={bs: (n, ms, 0) for bs, (n, ms) in alone[model].items()},
            by_shape=shapes[model],
            first_by_shape=firsts.get(model, {}),
        )
        metrics.on_stats(m.SubserverStats(model=model, step=step, tables=tables, kv=m.KvStats(1, 1)))  # fmt: skip
    metrics.tokens.update({"slm": 900 * k, "llm": 100 * k})
    metrics.hops.update({("slm", "llm"): 100 * k, ("llm", "slm"): 100 * k})
    for _ in range(10 * k):
        metrics.e2e.observe(1.0)
    metrics.visits.update(visits)
    return metrics.render(active=0)


def test_prefill_steps_leave_the_latencies_and_are_priced_per_request_and_per_token():
    before, after = scrape(1), scrape(3)  # the window: two rounds
    prof = profile_from_metrics(PLAN, after, before, min_steps=5, fit_alone=False)
    # slm: 400 decode steps of 2 ms, alone 2 ms; the 20 prefills (alone) left out of both
    assert dict(prof.step_ms["slm"].points) == pytest.approx({2: 2.0})
    assert dict(prof.alone_ms["slm"].points) == pytest.approx({2: 2.0})
    # llm: the stall is out already (slow-step counters), and not taken out twice
    assert dict(prof.step_ms["llm"].points) == pytest.approx({1: 6.0})
    committed = 2000.0  # tokens in the window, both models
    # per request: over the 20 that ended; per visit: over those each model wrote a token of
    assert prof.prefill["slm"] == pytest.approx({"steps": 20, "ms": 400.0 - 20 * 2.0, "ms_per_token": 360.0 / committed,
                                                 "ms_per_request": 360.0 / 20, "ms_per_visit": 360.0 / 20})  # fmt: skip
    assert prof.prefill["llm"] == pytest.approx({"steps": 10, "ms": 860.0 - 10 * 6.0, "ms_per_token": 800.0 / committed,
                                                 "ms_per_request": 800.0 / 20, "ms_per_visit": 800.0 / 10})  # fmt: skip
    assert prof.workload["prefill_steps"] == "longest row > 64"
    # left in: priced with the other steps of their batch size
    kept = profile_from_metrics(PLAN, after, before, min_steps=5, fit_alone=False, prefill_above=None)
    assert kept.prefill == {} and "prefill_steps" not in kept.workload
    assert dict(kept.step_ms["llm"].points) == pytest.approx({1: (1200.0 + 860.0) / 210})
    assert dict(kept.alone_ms["slm"].points) == pytest.approx({2: 800.0 / 220})


def test_profile_file_keeps_the_prefill_and_checks_it(tmp_path):
    prof = profile_from_metrics(PLAN, scrape(3), scrape(1), min_steps=5)
    write_profile(prof, tmp_path / "p.json")
    back = read_profile(tmp_path / "p.json").prefill
    assert set(back) == {"slm", "llm"} and all(back[x] == pytest.approx(prof.prefill[x]) for x in back)
    data = json.loads((tmp_path / "p.json").read_text())
    data["prefill"]["llm"]["ms_per_token"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"field prefill\.llm: prefill ms_per_token must be"):
        read_profile(tmp_path / "bad.json")
    data["prefill"]["llm"].update(ms_per_token=0.1, ms_per_request=float("nan"))
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"field prefill\.llm: prefill ms_per_request must be"):
        read_profile(tmp_path / "bad.json")
    data["prefill"] = {"xlm": {"ms_per_token": 1.0}}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"field prefill\.xlm: a model without step_ms"):
        read_profile(tmp_path / "bad.json")


def one_model(cost: PrefillCost | None, n: int = 1) -> SystemInputs:
    inputs = make_inputs(["m"], {"m": 10.0}, [[1.0]], [[1.0]], n)
    return SystemInputs(inputs.models, inputs.step, inputs.p, inputs.c, n, prefill=(cost,) if cost else ())


def test_the_chain_spreads_the_cost_over_the_steps():
    """One model, one request, a token a step: 2 ms of prefill per token make every step 12 ms."""
    assert analyze(one_model(None), (1,)).throughput == pytest.approx(100.0, rel=1e-3)
    res = analyze(one_model(PrefillCost(2.0)), (1,))
    assert res.throughput == pytest.approx(1000.0 / 12.0, rel=1e-3)
    assert res.prefill_ms == pytest.approx((2.0,))
    assert res.as_dict(("m",))["prefill_ms_per_step"] == {"m": pytest.approx(2.0)}


def test_at_the_fixed_point_each_model_spends_its_cost_per_committed_token():
    """Two models on the bernoulli chain at N = 4: whatever the thresholds, model i's added ms per step times its
    steps per second, over the tokens per second, is its cost per token."""
    steps = {"slm": StepLatency(((1, 2.0), (4, 2.6))), "llm": StepLatency(((1, 7.0), (4, 8.0)))}
    base = make_inputs(["slm", "llm"], steps, [[0.7, 0.3], [1.0, 0.0]], [[1.0, 1.0], [1.0, 0.0]], 4)
    costs = (PrefillCost(0.05), PrefillCost(0.16))
    inputs = SystemInputs(base.models, base.step, base.p, base.c, 4, prefill=costs)
    for b in ((1, 1), (1, 3), (2, 3)):
        plain, res = analyze(base, b), analyze(inputs, b)
        assert res.throughput < plain.throughput
        for i, cost in enumerate(costs):
            spent = res.prefill_ms[i] * res.steps_per_s[i] / res.throughput
            assert spent == pytest.approx(cost.ms_per_token, rel=0.02)


def test_the_simulator_adds_the_cost_to_a_requests_first_step():
    """One model, one request at a time, 10 tokens each of a 1 ms step: each request's first step takes 5 ms
    more, so three requests end at 45 ms; requests that never end pay it once, in the warm-up."""
    inputs = make_inputs(["m"], {"m": 1.0}, [[1.0]], [[1.0]], 1)
    costed = SystemInputs(inputs.models, inputs.step, inputs.p, inputs.c, 1, prefill=(PrefillCost(0.5, 5.0),))
    run = SimConfig((1,), request_tokens=10, requests=tuple(np.ones((1, 1)) for _ in range(3)))
    assert simulate(inputs, run).time_ms == pytest.approx(30.0)
    assert simulate(costed, run).time_ms == pytest.approx(45.0)
    closed = SimConfig((1,), horizon_ms=100.0, warmup_ms=10.0)
    assert simulate(costed, closed).throughput == pytest.approx(simulate(inputs, closed).throughput)
    # no cost per visit known: the simulator prices none
    unknown = SystemInputs(inputs.models, inputs.step, inputs.p, inputs.c, 1, prefill=(PrefillCost(0.5),))
    assert simulate(unknown, run).time_ms == pytest.approx(30.0)


def test_a_cost_per_request_is_spread_over_the_tokens_of_the_load_tuned_for():
    """The matrix profiles with 256-token requests and benchmarks 512-token ones: a prefill per request then
    costs half as much per token. Without a count of the requests a model reached the profile's own cost per
    token stays, with a warning."""
    prof = profile_from_metrics(PLAN, scrape(3), scrape(1), min_steps=5)
    base = make_inputs(
        ["slm", "llm"], {"slm": 2.0, "llm": 6.0}, [[0.9, 0.1], [1.0, 0.0]], [[1, 1], [1, 0]], 4
    )
    own = with_prefill(base, prof, ["slm", "llm"])
    assert [c.ms_per_token for c in own.prefill] == pytest.approx([360.0 / 2000, 800.0 / 2000])
    longer = with_prefill(base, prof, ["slm", "llm"], request_tokens=400)
    # llm: 80 ms per request reaching it, half the requests reached it, 400 tokens each
    assert [c.ms_per_token for c in longer.prefill] == pytest.approx([18.0 / 400, 80.0 * 0.5 / 400])
    assert with_prefill(base, prof, ["slm"]).prefill[1] is None
    for cost in prof.prefill.values():  # a profile whose server did not count the requests that ended
        cost.pop("ms_per_request")
    warnings: list[str] = []
    stays = with_prefill(base, prof, ["slm", "llm"], 400, warnings)
    assert [c.ms_per_token for c in stays.prefill] == pytest.approx([360.0 / 2000, 800.0 / 2000])
    assert len(warnings) == 2 and "not scaled to 400 tokens per request" in warnings[1]


def test_servers_that_count_first_runs_price_those_steps_and_not_long_returns():
    """From metrics layout 2 the subservers count the steps that ran some request's first tokens: those
    are the prefills, whatever their length (a 32-token prompt here), and a return after 128 tokens away stays
    in its batch size's latency; the cost per visit is over the first runs counted."""
    k = 1
    shapes = {
        "slm": {"2/1/alone": (200, 400.0, 400), "2/32/alone": (10, 40.0, 340)},
        "llm": {"1/1/untracked": (100, 600.0, 100), "1/128/untracked": (5, 50.0, 600),
                "1/64/untracked": (5, 50.0, 300)},
    }  # fmt: skip
    firsts = {"slm": {"2/32/alone": (10, 40.0, 10)}, "llm": {"1/64/untracked": (5, 50.0, 5)}}
    by_bs = {"slm": {2: (210, 440.0)}, "llm": {1: (110, 700.0)}}
    alone = {"slm": {2: (210, 440.0)}, "llm": {}}
    after = render(k, shapes, firsts, by_bs, alone, {"slm": {}, "llm": {}}, {"slm": 10, "llm": 5})
    assert (
        'tokenrouter_first_step_rows_by_shape_total{model="llm",bs="1",q="64",overlap="untracked"} 5' in after
    )
    prof = profile_from_metrics(PLAN, after, min_steps=5, fit_alone=False)
    assert prof.workload["prefill_steps"] == "first runs"
    assert dict(prof.step_ms["slm"].points) == pytest.approx({2: 2.0})
    assert dict(prof.step_ms["llm"].points) == pytest.approx({1: 650.0 / 105})  # the long return stays
    routine = 650.0 / 105
    assert prof.prefill["llm"] == pytest.approx({"steps": 5, "ms": round(50.0 - 5 * routine, 3), "ms_per_token": (50.0 - 5 * routine) / 1000,
                                                 "ms_per_request": (50.0 - 5 * routine) / 10, "ms_per_visit": (50.0 - 5 * routine) / 5})  # fmt: skip
    assert prof.prefill["slm"]["ms_per_visit"] == pytest.approx(2.0)  # 10 runs of 4 ms against 2


def test_a_benchmarks_requests_give_the_cost_per_visit():
    """Records that keep no count of the requests a model reached: the entry model's cost per visit is its
    cost per token times the tokens of the requests, over all of them; another model's over those it wrote in."""
    base = make_inputs(
        ["slm", "llm"], {"slm": 2.0, "llm": 6.0}, [[0.9, 0.1], [1.0, 0.0]], [[1, 1], [1, 0]], 4
    )
    inputs = SystemInputs(
        base.models, base.step, base.p, base.c, 4, prefill=(PrefillCost(0.1), PrefillCost(0.2))
    )
    records = [{"ok": True, "tokens_per_model": {"slm": 90, "llm": 10}},
               {"ok": True, "tokens_per_model": {"slm": 100}},
               {"ok": False, "tokens_per_model": {"slm": 5}}]  # fmt: skip
    costs = with_visit_costs(inputs, records).prefill
    assert costs[0].ms_per_visit == pytest.approx(0.1 * 200 / 2)
    assert costs[1].ms_per_visit == pytest.approx(0.2 * 200 / 1)
    # a measured cost per visit stays
    given = SystemInputs(base.models, base.step, base.p, base.c, 4, prefill=(PrefillCost(0.1, 7.0), None))
    assert with_visit_costs(given, records).prefill == (PrefillCost(0.1, 7.0), None)


def test_cli_profile_then_tune_for_longer_requests(tmp_path):
    (tmp_path / "after.txt").write_text(scrape(3))
    (tmp_path / "before.txt").write_text(scrape(1))
    cli = [sys.executable, "-m", "tokenrouter.cli"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*cli, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)

    prof = tmp_path / "p.json"
    r = run("profile", "examples/bernoulli.tr", "--from-metrics", str(tmp_path / "after.txt"), "--since",
            str(tmp_path / "before.txt"), "-o", str(prof))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "llm: prompt prefills (10 steps, longest row > 64) priced apart: 800.0 ms beyond" in r.stdout
    assert "0.4000 ms per committed token, 40.00 per request that ended, 80.00 per first run" in r.stdout
    r = run("tune", "examples/bernoulli.tr", "--profile", str(prof), "-n", "4", "--request-tokens", "400",
            "-o", str(tmp_path / "t.plan"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "prompt prefill, apart from the step latency: slm 0.045 ms per committed token" in r.stdout
    assert "(profile; priced for 400 tokens per request (--request-tokens))" in r.stdout
    r = run(
        "tune", "examples/bernoulli.tr", "--profile", str(prof), "-n", "4", "-o", str(tmp_path / "u.plan")
    )
    assert r.returncode == 0, r.stderr
    assert "slm 0.18 ms per committed token" in r.stdout  # the profile's own: 100-token requests
    assert (
        "priced for the profile's own load, 100 tokens per request (--request-tokens prices another)"
        in r.stdout
    )
    tuning = json.loads((tmp_path / "t.plan").read_text())["tuning"]
    assert tuning["prefill"]["llm"] == {
        "ms_per_token": pytest.approx(0.1),
        "ms_per_visit": pytest.approx(80.0),
    }
    assert tuning["sources"]["prefill"] == {"slm": "profile", "llm": "profile"}
    assert tuning["result"]["candidates"][0]["prefill_ms_per_step"]["llm"] > 0
    kept = tmp_path / "kept.json"
    r = run("profile", "examples/bernoulli.tr", "--from-metrics", str(tmp_path / "after.txt"), "--since",
            str(tmp_path / "before.txt"), "--keep-prefills", "-o", str(kept))  # fmt: skip
    assert r.returncode == 0 and "prefill" not in json.loads(kept.read_text())
    for args, message in (
        (("profile", "examples/bernoulli.tr", "--keep-prefills"), "--keep-prefills goes with --from-metrics"),
        (("tune", "examples/bernoulli.tr", "--profile", str(prof), "--request-tokens", "0"),
         "--request-tokens must be an int >= 1"),
    ):  # fmt: skip
        r = run(*args)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
