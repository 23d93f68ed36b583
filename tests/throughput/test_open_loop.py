"""The simulator's open loop (`SimConfig.arrival_rate_per_s`, `tokenrouter simulate --request-rate`): requests
arrive as a Poisson process, at most N in flight, and each measured request's latencies are reported."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.throughput.inputs import make_inputs
from tokenrouter.throughput.simulate import SimConfig, simulate


def one_model(n: int, step_ms: float = 1.0):
    return make_inputs(["llm"], {"llm": step_ms}, [[1.0]], [[1.0]], n)


def test_a_request_alone_takes_its_tokens_steps():
    """At a rate far below what one model serves, requests rarely meet: each takes `tokens` steps of 1 ms, its
    first token after the first step, and waits at the cap for nobody."""
    cfg = SimConfig((1,), request_tokens=20, arrival_rate_per_s=1.0, horizon_ms=200_000.0, warmup_ms=1_000.0)
    res = simulate(one_model(4), cfg)
    lat = res.latency
    assert lat["measured"] > 150 and lat["backlog"] == 0
    assert lat["ttft_ms"]["p50"] == pytest.approx(1.0)
    assert lat["tpot_ms"]["p50"] == pytest.approx(1.0)
    assert lat["e2e_ms"]["p50"] == pytest.approx(20.0)
    assert lat["queued_ms"]["p99"] == 0.0 and lat["from_arrival_ms"]["p50"] == pytest.approx(20.0)
    assert res.throughput == pytest.approx(20.0, rel=0.15)  # 1 request/s x 20 tokens


def test_over_capacity_the_wait_at_the_cap_grows_with_the_horizon():
    """One model at B = 1 with N = 2 serves at most 2 requests of 10 x 1 ms steps at a time: 200 requests/s.
    Offered 300, the requests pile up at the cap, and the longer the run the longer they wait."""
    waits = []
    for horizon in (2_000.0, 8_000.0):
        cfg = SimConfig(
            (1,), request_tokens=10, arrival_rate_per_s=300.0, horizon_ms=horizon, warmup_ms=100.0
        )
        res = simulate(one_model(2), cfg)
        assert res.throughput == pytest.approx(2_000.0, rel=0.02)  # 200 requests/s x 10 tokens: saturated
        waits.append(res.latency["queued_ms"]["p50"])
        assert res.latency["backlog"] > 100
    assert waits[1] > 3 * waits[0]


def test_closed_loop_results_have_no_latency_and_bad_settings_are_refused():
    assert simulate(one_model(2), SimConfig((1,), request_tokens=10, horizon_ms=100.0)).latency is None
    for bad in (dict(arrival_rate_per_s=0.0, request_tokens=10), dict(arrival_rate_per_s=math.inf, request_tokens=10),
                dict(arrival_rate_per_s=1.0), dict(arrival_rate_per_s=1.0, request_tokens=10, think_ms=5.0)):  # fmt: skip
        with pytest.raises(ValueError):
            SimConfig((1,), **bad)


def test_simulate_request_rate_prints_the_latencies(tmp_path):
    plan = tmp_path / "p.tr"
    plan.write_text(
        'policy duo\nmodel slm = "s" { batch: 1 }\nmodel llm = "l" { batch: 1 }\nserve { concurrency: 8 }\n'
        "entry slm\nroute slm { when uniform() < 0.1 -> llm }\nroute llm { -> slm }\n"
    )
    base = ["simulate", str(plan), "--step-ms", "slm=1", "--step-ms", "llm=5", "--horizon-ms", "20000"]
    res = CliRunner().invoke(app, [*base, "--request-rate", "20", "--request-tokens", "64"])
    assert res.exit_code == 0, res.output
    assert "an open loop of 20 requests/s (Poisson), at most N in flight" in res.output
    for label in ("TTFT p50 / p99", "TPOT p50 / p99", "E2E p50 / p99", "queued at the cap p50 / p99",
                  "from arrival to end p50 / p99"):  # fmt: skip
        assert label in res.output
    data = json.loads(
        CliRunner().invoke(app, [*base, "--request-rate", "20", "--request-tokens", "64", "--json"]).output
    )
    assert data["simulation"]["latency"]["measured"] > 300
    over = CliRunner().invoke(app, [*base, "--request-rate", "400", "--request-tokens", "64"])
    assert "requests were waiting at the cap at the end" in over.output
    res = CliRunner().invoke(app, [*base, "--request-rate", "20"])
    assert res.exit_code == 2 and "--request-rate (an open loop) needs --request-tokens" in res.output
