"""Tuning for latency at an offered load (`rate_tune`, `tokenrouter tune --request-rate`), and the simulator's
given arrival times (`SimConfig.arrivals_ms`) that it runs every candidate on."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.throughput.inputs import StepLatency, make_inputs
from tokenrouter.throughput.optimize import TuneError, candidates
from tokenrouter.throughput.rate_tune import (
    BEYOND_SHARE,
    RateSettings,
    arrivals,
    measured_sizes,
    tune_at_rate,
)
from tokenrouter.throughput.simulate import SimConfig, simulate

P = [[0.9, 0.1], [1.0, 0.0]]
C = [[1.0, 1.0], [1.0, 1.0]]


def duo(n: int, llm=5.0):
    return make_inputs(["slm", "llm"], {"slm": 1.0, "llm": llm}, P, C, n)


def test_given_arrivals_are_served_as_given():
    """Requests 500 ms apart never meet: each takes its 20 steps of 1 ms; those after the horizon never come."""
    inp = make_inputs(["llm"], {"llm": 1.0}, [[1.0]], [[1.0]], 4)
    times = tuple(500.0 * k for k in range(100))
    res = simulate(
        inp, SimConfig((1,), request_tokens=20, arrivals_ms=times, horizon_ms=9_000.0, warmup_ms=1_000.0)
    )
    lat = res.latency
    # arrived after the warm-up and ended in the horizon: 1000, 1500, ..., 9500 (ends 9520 < 10000)
    assert lat["measured"] == 18 and lat["backlog"] == 0 and lat["unfinished"] == 0
    assert lat["e2e_ms"]["p99"] == pytest.approx(20.0) and lat["from_arrival_ms"]["p50"] == pytest.approx(
        20.0
    )
    assert res.finished_requests == 20  # the two of the warm-up too


def test_a_step_gap_lengthens_every_step():
    """`gap_ms`: each step takes its model's host gap beyond its latency: 20 steps of 1 + 0.25 ms."""
    inp = make_inputs(["llm"], {"llm": 1.0}, [[1.0]], [[1.0]], 4)
    times = tuple(500.0 * k for k in range(4))
    cfg = SimConfig(
        (1,), request_tokens=20, arrivals_ms=times, gap_ms=(0.25,), horizon_ms=60_000.0, warmup_ms=0.0
    )
    res = simulate(inp, cfg)
    assert res.latency["measured"] == 4 and res.latency["e2e_ms"]["p50"] == pytest.approx(25.0)
    assert res.latency["tpot_ms"]["p50"] == pytest.approx(1.25)
    # the given arrivals over and their requests ended, the run ends: 1500 + 25 ms, not the horizon
    assert res.time_ms == pytest.approx(1525.0)
    for bad in ((-1.0,), (float("inf"),)):
        with pytest.raises(ValueError, match="gap_ms must be finite numbers >= 0"):
            SimConfig((1,), request_tokens=20, arrivals_ms=times, gap_ms=bad)
    with pytest.raises(ValueError, match="expected 1 step gaps"):
        simulate(inp, SimConfig((1,), request_tokens=20, arrivals_ms=times, gap_ms=(0.1, 0.2)))


def test_simulate_replays_a_reports_arrivals(tmp_path):
    """`simulate --arrivals REPORT`: an open loop on the report's arrival times (send time less the wait at the
    cap), its output length and cap by default, every request measured; a closed-loop report is refused."""
    plan = source(tmp_path)
    per = [{"ok": True, "start_s": 0.5 * k + (0.1 if k == 3 else 0.0), "queued_s": 0.1 if k == 3 else 0.0,
            "e2e_s": 0.1, "output_tokens": 16} for k in range(6)]  # fmt: skip
    spec = {"request_rate": 2.0, "output_len": 16, "concurrency": 2}
    (tmp_path / "open.json").write_text(json.dumps({"spec": spec, "per_request": per}))
    (tmp_path / "closed.json").write_text(
        json.dumps({"spec": spec | {"request_rate": None}, "per_request": per})
    )
    from tokenrouter.throughput.workload import read_arrivals

    assert read_arrivals(tmp_path / "open.json") == ((0.0, 500.0, 1000.0, 1500.0, 2000.0, 2500.0), 16, 2)
    base = [
        "simulate",
        str(plan),
        "--step-ms",
        "slm=1",
        "--step-ms",
        "llm=5",
        "--batch",
        "slm=1",
        "--batch",
        "llm=1",
    ]
    res = CliRunner().invoke(app, [*base, "--arrivals", str(tmp_path / "open.json"), "--gap-ms", "slm=0.5"])
    assert res.exit_code == 0, res.output
    assert (
        "simulate duo: N = 2, " in res.output
        and "'s 6 arrivals, at most N in flight, to the last" in res.output
    )
    assert "requests measured (arrived after the warm-up, ended in the horizon): 6" in res.output
    assert "host time per step beyond its latency: slm 0.5 ms, llm 0 ms" in res.output
    res = CliRunner().invoke(app, [*base, "--arrivals", str(tmp_path / "closed.json")])
    assert res.exit_code == 1 and "a closed loop (no request rate)" in res.output
    res = CliRunner().invoke(app, [*base, "--arrivals", str(tmp_path / "open.json"), "--request-rate", "2"])
    assert res.exit_code == 2 and "--arrivals replays a report's open loop" in res.output


def test_given_arrivals_are_checked():
    for bad in (dict(arrivals_ms=(0.0, 2.0, 1.0)), dict(arrivals_ms=(-1.0,)), dict(arrivals_ms=(float("nan"),)),
                dict(arrivals_ms=(0.0,), arrival_rate_per_s=1.0), dict(arrivals_ms=(0.0,), request_tokens=None)):  # fmt: skip
        with pytest.raises(ValueError):
            SimConfig((1,), **{"request_tokens": 10, **bad})


def test_arrivals_are_poisson_at_the_rate_and_the_same_for_a_seed():
    a = arrivals(50.0, 200_000.0, 0)
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:], strict=False)) and a[-1] < 200_000.0
    assert len(a) == pytest.approx(10_000, rel=0.05)
    assert a == arrivals(50.0, 200_000.0, 0) and a != arrivals(50.0, 200_000.0, 1)


def test_each_candidate_is_ranked_on_the_same_arrivals_as_simulate_gives():
    """With every candidate in the final round (no screening), each score is the mean over the seeds of what
    `simulate` gives on that seed's arrivals; in two processes the same."""
    inp = duo(3)
    s = RateSettings(40.0, 32, objective="from-arrival-p50", max_delay_ms=5.0, horizon_ms=5_000.0,
                     warmup_ms=500.0, seeds=2, keep=10)  # fmt: skip
    res = tune_at_rate(inp, s)
    assert not res.screened and res.unpriced == 0 and len(res.results) == len(candidates(2, 3, {})) == 6
    for c in res.results:
        want = [
            simulate(inp, SimConfig(c.thresholds, seed=k, request_tokens=32, max_delay_ms=5.0, horizon_ms=5_000.0,
                                    warmup_ms=500.0, arrivals_ms=arrivals(40.0, 5_500.0, k))).latency
            for k in range(2)
        ]  # fmt: skip
        assert c.scores == tuple(w["from_arrival_ms"]["p50"] for w in want)
        assert c.score == pytest.approx(sum(c.scores) / 2, rel=1e-12)
        # against the best seed by seed: the mean, the spread and the seeds where the best was lower
        d = [x - y for x, y in zip(c.scores, res.best.scores, strict=True)]
        mean, sd, lower = res.behind_best(c)
        assert mean == pytest.approx(sum(d) / 2) and sd == pytest.approx(abs(d[0] - d[1]) / 2**0.5)
        assert lower == sum(x > 0 for x in d)
    scores = [c.score for c in res.results]
    assert scores == sorted(scores)
    par = tune_at_rate(inp, RateSettings(**{**{f: getattr(s, f) for f in s.__slots__}, "jobs": 2}))
    assert [(c.thresholds, c.score) for c in par.results] == [(c.thresholds, c.score) for c in res.results]


def test_without_a_shared_gpu_waiting_for_rows_only_adds_latency():
    """Independent models whose steps cost the same at any size gain nothing from a batch: B = (1, 1) has the
    lowest latency, and a threshold held to the timeout is far behind it. The screening round keeps the best."""
    res = tune_at_rate(duo(8), RateSettings(30.0, 64, max_delay_ms=20.0, horizon_ms=20_000.0, screen_ms=5_000.0,
                                            warmup_ms=1_000.0, seeds=2, keep=3))  # fmt: skip
    assert len(res.screened) == 36 and len(res.results) == 3
    assert res.best.thresholds == (1, 1) and not res.best.behind
    assert [c.thresholds for c in res.results] == [c.thresholds for c in res.screened[:3]]
    worst = res.screened[-1]
    assert worst.score > 2 * res.best.score


def test_candidates_priced_beyond_the_measured_batch_sizes_rank_after():
    """The large model measured at 1-2 rows: a candidate that runs more than 5 % of its steps with more rows
    (priced as 2 rows) ranks after every one priced within the measurements, whatever its latency."""
    half = [[0.5, 0.5], [1.0, 0.0]]  # every other token on the large model: its queue often holds more than 2
    inp = make_inputs(["slm", "llm"], {"slm": 1.0, "llm": StepLatency(((1, 5.0), (2, 5.5)))}, half, C, 6)
    assert measured_sizes(inp) == (math.inf, 2) and measured_sizes(inp, ["slm"]) == (1, 2)
    res = tune_at_rate(inp, RateSettings(30.0, 16, max_delay_ms=5.0, horizon_ms=3_000.0, warmup_ms=0.0, seeds=1,
                                         keep=50))  # fmt: skip
    flags = [c.unpriced for c in res.results]
    assert any(flags) and not all(flags) and flags == sorted(flags)  # the priced ones first
    assert res.unpriced == sum(flags) and res.limits == (math.inf, 2)
    for c in res.results:  # the share is of the llm's steps above 2 rows
        assert c.beyond[0] == 0.0 and c.unpriced == (c.beyond[1] > BEYOND_SHARE)
    assert not res.best.unpriced
    # a threshold the plan fixes is simulated as given, beyond the measured sizes or not
    fixed = tune_at_rate(inp, RateSettings(30.0, 16, horizon_ms=3_000.0, warmup_ms=0.0, seeds=1), {"llm": 4})
    assert {c.thresholds[1] for c in fixed.results} == {4} and all(c.unpriced for c in fixed.results)


def test_a_rate_over_what_any_threshold_serves_marks_every_candidate_behind():
    res = tune_at_rate(duo(2, llm=50.0), RateSettings(500.0, 64, horizon_ms=4_000.0, warmup_ms=0.0, seeds=1))
    assert all(c.behind for c in res.results) and res.best.backlog > 4


def test_candidates_with_no_measured_request_rank_by_throughput():
    """A warm-up longer than the horizon measures no request: the candidates rank by what they serve, here the
    llm's fullest batches first (its step costs the same at any size), not by their thresholds."""
    inp = make_inputs(["slm", "llm"], {"slm": 1.0, "llm": 20.0}, [[0.5, 0.5], [1.0, 0.0]], C, 4)
    res = tune_at_rate(
        inp, RateSettings(500.0, 64, horizon_ms=2_000.0, warmup_ms=3_000.0, seeds=1, keep=3, jobs=1)
    )
    assert all(math.isnan(c.score) for c in res.screened)
    assert res.best.thresholds == (1, 4)
    assert [c.throughput for c in res.screened] == sorted((c.throughput for c in res.screened), reverse=True)


def test_a_run_where_no_measured_request_ends_ranks_by_throughput_and_writes_null(tmp_path):
    """Far over what any threshold serves, with a warm-up longer than the horizon, no request that arrived after the
    warm-up ends: every latency is NaN. The candidates then rank by throughput, the output says so instead of
    printing NaN, no "level" note compares NaNs, and the plan, `--json` and `simulate --json` are strict JSON
    (null, not NaN); `inspect` shows the tuning."""
    plan = source(tmp_path)
    base = ["--step-ms", "slm=6", "--step-ms", "llm=27.9", "--request-tokens", "32", "--horizon-ms", "5000"]
    res = CliRunner().invoke(
        app, ["tune", str(plan), *base, "--request-rate", "50", "--seeds", "2", "--jobs", "1"]
    )
    assert res.exit_code == 0, res.output
    assert (
        "ranked by throughput" in res.stdout and "nan" not in res.stdout and "level within" not in res.stdout
    )
    text = (tmp_path / "p.plan").read_text()
    written = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the plan"))
    result = written["tuning"]["result"]
    assert result["score_ms"] is None and result["candidates"][0]["latency"]["tpot_ms"]["p50"] is None
    tput = [c["throughput_tok_s"] for c in result["candidates"]]
    assert tput == sorted(tput, reverse=True)
    shown = CliRunner().invoke(app, ["inspect", str(tmp_path / "p.plan")])
    assert "for latency at 50 requests/s of 32 tokens (open-loop simulation): B* slm " in shown.stdout, (
        shown.output
    )
    sim = CliRunner().invoke(app, ["simulate", str(plan), *base, "--request-rate", "50", "--warmup-ms", "10000",
                                   "--batch", "slm=1", "--batch", "llm=1", "--json"])  # fmt: skip
    lat = json.loads(sim.stdout, parse_constant=lambda c: pytest.fail(f"{c} in simulate --json"))
    assert lat["simulation"]["latency"]["ttft_ms"]["p50"] is None


def test_bad_settings_and_fixed_thresholds_are_refused():
    for bad in (dict(rate_per_s=0.0), dict(request_tokens=1), dict(objective="speed"), dict(seeds=0),
                dict(max_delay_ms=-1.0), dict(horizon_ms=0.0)):  # fmt: skip
        with pytest.raises(ValueError):
            RateSettings(**{"rate_per_s": 1.0, "request_tokens": 8, **bad})
    with pytest.raises(TuneError, match="Σ"):
        tune_at_rate(duo(2), RateSettings(1.0, 8), {"slm": 3})


def source(tmp_path):
    plan = tmp_path / "p.tr"
    plan.write_text(
        'policy duo\nmodel slm = "s" { batch: auto }\nmodel llm = "l" { batch: auto }\n'
        "serve { concurrency: 4, max_delay_ms: 20 }\nentry slm\nroute slm { when uniform() < 0.1 -> llm }\n"
        "route llm { -> slm }\n"
    )
    return plan


def test_tune_request_rate_writes_the_plan(tmp_path):
    plan = source(tmp_path)
    base = ["tune", str(plan), "--step-ms", "slm=1", "--step-ms", "llm=5", "--request-tokens", "64",
            "--request-rate", "20", "--horizon-ms", "10000", "--seeds", "2", "--keep", "3", "--jobs", "1"]  # fmt: skip
    res = CliRunner().invoke(app, base)
    assert res.exit_code == 0, res.output
    assert (
        "tune duo at 20 requests/s (Poisson, at most N = 4 in flight, 64 tokens each, max_delay_ms 20)"
        in res.output
    )
    assert "10 simulated once over 2 s, the best 3 again over 10 s with 2 seeds" in res.output
    assert "B* = slm 1, llm 1" in res.output
    # (2, 1) is behind in both seeds, by less than two standard deviations of the paired differences
    assert (
        "note: 2,1 is " in res.output
        and "the two are level within what the simulation can tell" in res.output
    )
    written = json.loads((tmp_path / "p.plan").read_text())
    assert {m: written["models"][m]["batch"] for m in ("slm", "llm")} == {"slm": 1, "llm": 1}
    result = written["tuning"]["result"]
    assert result["method"] == "open-loop simulation" and result["objective"] == "from-arrival-p99"
    assert (
        result["max_delay_ms"] == 20.0
        and len(result["candidates"]) == 3
        and "delta_ms" not in written["tuning"]
    )
    out = CliRunner().invoke(
        app, [*base, "--objective", "tpot-p50", "--json", "-o", str(tmp_path / "q.plan")]
    )
    assert json.loads(out.output)["tuning"]["result"]["objective"] == "tpot-p50"
    assert (tmp_path / "q.plan").exists()


def test_tune_warns_when_its_choice_runs_steps_beyond_the_measured_sizes(tmp_path):
    """A plan whose llm threshold is fixed at 4, measured up to 2 rows, with every other token on the llm: the
    chosen B* runs more than 5 % of the llm's steps above 2 rows, and `tune` says so."""
    plan = tmp_path / "p.tr"
    plan.write_text(
        source(tmp_path)
        .read_text()
        .replace('model llm = "l" { batch: auto }', 'model llm = "l" { batch: 4 }')
    )
    res = CliRunner().invoke(app, ["tune", str(plan), "--step-ms", "slm=1", "--step-ms", "llm=1:5,2:5.5",
                                   "--p", "slm:llm=0.5", "--request-tokens", "16", "--request-rate", "30",
                                   "--horizon-ms", "3000", "--seeds", "1", "--jobs", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "warning: B* = slm " in res.output and ", llm 4: " in res.output
    assert "of llm's simulated steps had more than 2 rows" in res.output and "(ranked after)" in res.output


def test_simulate_warns_of_steps_priced_beyond_the_measured_sizes(tmp_path):
    plan = source(tmp_path)
    base = ["simulate", str(plan), "--step-ms", "slm=1", "--step-ms", "llm=1:5,2:5.5", "--batch", "slm=1",
            "--request-tokens", "16", "--horizon-ms", "3000", "--no-chain"]  # fmt: skip
    busy = CliRunner().invoke(app, [*base, "--batch", "llm=4", "--p", "slm:llm=0.5", "--request-rate", "60"])
    assert busy.exit_code == 0, busy.output
    assert (
        "of llm's simulated steps had more than 2 rows, the largest batch size its step latency"
        in busy.output
    )
    calm = CliRunner().invoke(app, [*base, "--batch", "llm=1", "--request-rate", "1"])
    assert calm.exit_code == 0 and "simulated steps had more than" not in calm.output, calm.output


def test_hop_ms_profile_takes_the_profiles_measured_delays(tmp_path):
    """`--hop-ms profile` (simulate, and tune --request-rate): each model's hop delay from the profile's
    `workload.hop_ms` (0 for a model it lacks); refused without them, or beside another --hop-ms."""
    from tokenrouter.throughput.profile_format import Profile, write_profile

    plan = source(tmp_path)
    step = {"slm": StepLatency(((1, 1.0), (4, 1.2))), "llm": StepLatency(((1, 5.0), (4, 5.5)))}
    routing = {"slm": {"slm": 0.9, "llm": 0.1}, "llm": {"slm": 1.0}}
    write_profile(
        Profile("duo", None, step, routing, workload={"hop_ms": {"llm": 0.75}}), tmp_path / "hops.json"
    )
    write_profile(Profile("duo", None, step, routing), tmp_path / "none.json")
    sim = [
        "simulate",
        str(plan),
        "--batch",
        "slm=1",
        "--batch",
        "llm=1",
        "--no-chain",
        "--horizon-ms",
        "2000",
    ]
    res = CliRunner().invoke(app, [*sim, "--profile", str(tmp_path / "hops.json"), "--hop-ms", "profile"])
    assert res.exit_code == 0 and "hop delay into each model: slm 0 ms, llm 0.75 ms" in res.output, res.output
    assert "note: the profile measured hop delays" not in res.output
    res = CliRunner().invoke(app, [*sim, "--profile", str(tmp_path / "hops.json")])
    assert (
        "note: the profile measured hop delays (llm 0.75 ms), which this simulation leaves out; `--hop-ms "
        in res.output
    )
    tune = ["tune", str(plan), "--profile", str(tmp_path / "hops.json"), "--request-tokens", "16", "--request-rate",
            "20", "--horizon-ms", "5000", "--seeds", "1", "--jobs", "1", "--hop-ms", "profile", "--json"]  # fmt: skip
    res = CliRunner().invoke(app, tune)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["tuning"]["result"]["hop_ms"] == {"slm": 0.0, "llm": 0.75}
    res = CliRunner().invoke(app, [*sim, "--profile", str(tmp_path / "none.json"), "--hop-ms", "profile"])
    assert res.exit_code == 1 and "--hop-ms profile: the profile has no hop delays" in res.output
    res = CliRunner().invoke(app, [*sim, "--profile", str(tmp_path / "hops.json"), "--hop-ms", "profile",
                                   "--hop-ms", "llm=1"])  # fmt: skip
    assert res.exit_code == 2 and "give it alone" in res.output


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--objective", "tpot-p50"], "--objective needs --request-rate"),
        (["--max-delay-ms", "0", "--seeds", "2"], "--max-delay-ms, --seeds need --request-rate"),
        (["--request-rate", "5"], "--request-rate (an open loop) needs --request-tokens"),
        (["--request-rate", "5", "--request-tokens", "8", "--objective", "fast"], "unknown objective 'fast'"),
        (
            ["--request-rate", "5", "--request-tokens", "8", "--plot", "x.png"],
            "--plot charts the chain's T(B)",
        ),
        (["--request-rate", "-1", "--request-tokens", "8"], "the request rate must be a finite number > 0"),
    ],
)
def test_tune_request_rate_usage_errors(tmp_path, extra, message):
    res = CliRunner().invoke(
        app, ["tune", str(source(tmp_path)), "--step-ms", "slm=1", "--step-ms", "llm=5", *extra]
    )
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "p.plan").exists()
