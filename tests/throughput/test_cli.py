import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.compiler.passes.check_feasibility import feasibility_error
from tokenrouter.compiler.plan import read_plan

runner = CliRunner()

R2R_LIKE = """policy r2rlike
model slm = "s" { batch: 1 }
model llm = "l" { batch: auto }
serve { concurrency: 4 }
entry slm
route slm {
  when uniform() < 0.35 -> llm drop
}
route llm { -> slm }
"""

FIXED = R2R_LIKE.replace("batch: auto", "batch: 2").replace("batch: 1", "batch: 2")


def write(tmp_path: Path, text: str, name: str = "p.tr") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_tune_writes_best_threshold_into_plan(tmp_path):
    src = write(tmp_path, R2R_LIKE)
    out = tmp_path / "out.plan"
    res = runner.invoke(app, ["tune", src, "--step-ms", "slm=6.0", "--step-ms", "llm=27.9", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "B* = slm 1, llm 3" in res.output
    plan = read_plan(out)
    assert plan["models"]["llm"]["batch"] == 3 and plan["models"]["slm"]["batch"] == 1
    assert plan["tuning"]["auto"] == ["llm"]
    assert plan["tuning"]["p"]["slm"] == pytest.approx({"slm": 0.65, "llm": 0.35})
    assert plan["tuning"]["c"]["slm"]["llm"] == 0.0
    assert plan["checks"]["feasibility"]["ok"] is True
    # re-tuning the tuned plan at another N re-chooses the auto model's threshold
    res = runner.invoke(
        app, ["tune", str(out), "-n", "3", "--step-ms", "slm=6.0", "--step-ms", "llm=27.9", "--json"]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["tuning"]["result"]["best"] == {"slm": 1, "llm": 2}
    assert read_plan(out)["serve"]["concurrency"] == 3


def test_tune_warns_when_the_timeout_will_cut_the_chosen_batches(tmp_path):
    """The chain has no max_delay_ms timeout: when the chosen B_i takes longer to gather, at the rate the
    chain predicts, than the plan's timeout, tune says so (stderr and tuning.warnings)."""
    args = ["--step-ms", "slm=6.0", "--step-ms", "llm=27.9", "--json"]
    res = runner.invoke(app, ["tune", write(tmp_path, R2R_LIKE), *args])  # B* = (1, 3), max_delay 5 ms
    assert res.exit_code == 0, res.output
    tuning = json.loads(res.stdout)["tuning"]
    best = next(c for c in tuning["result"]["candidates"] if c["thresholds"] == {"slm": 1, "llm": 3})
    rate = best["steps_per_s"]["llm"] * best["mean_batch"]["llm"]
    fill = 2000.0 / rate  # the 2 requests after the first
    assert fill > 5.0
    line, checked = tuning["warnings"]
    assert line.startswith(
        f"B_llm = 3: at the predicted {rate:.0f} tokens/s through llm, it gathers 3 rows in about {fill:.0f} ms"
    )
    # B* and the plan's setting are simulated with the timeout; B* serves as well (within 1 %): kept
    assert checked.startswith(
        "the chain has no timeout; simulated with max_delay_ms = 5, its B* (slm 1, llm 3)"
    )
    assert checked.endswith(": B* is kept (within 1 %, a tie)") and tuning["timeout_check"]["kept"] == "best"
    assert "longer than max_delay_ms = 5" in line and f"warning: {line}" in res.stderr
    # it suggests a timeout of about twice the gathering time, rounded up to 5 ms
    suggested = 5 * math.ceil(2 * fill / 5)
    assert line.endswith(f"`serve {{ max_delay_ms: {suggested} }}` would let them fill")
    # a timeout longer than that: no warning
    slow = R2R_LIKE.replace(
        "serve { concurrency: 4 }", f"serve {{ concurrency: 4, max_delay_ms: {fill + 1:.0f} }}"
    )
    res = runner.invoke(app, ["tune", write(tmp_path, slow, "slow.tr"), *args])
    assert res.exit_code == 0 and "warnings" not in json.loads(res.stdout)["tuning"] and not res.stderr


def test_tune_keeps_the_plans_setting_where_the_timeout_makes_b_star_serve_worse(tmp_path):
    """B* = (1, 3) gathers its llm batches for longer than a 10 ms timeout: simulated with it, B* serves
    184 tok/s and the plan's (1, 1) 187, so tune writes (1, 1) and says why."""
    src = write(tmp_path, R2R_LIKE.replace("concurrency: 4", "concurrency: 4, max_delay_ms: 10"))
    out = tmp_path / "out.plan"
    res = runner.invoke(app, ["tune", src, "--step-ms", "slm=6.0", "--step-ms", "llm=27.9", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "the chain has no timeout; simulated with max_delay_ms = 10, its B* (slm 1, llm 3)" in res.stderr
    assert "the plan's setting (slm 1, llm 1)" in res.stderr and "the plan's setting is kept" in res.stderr
    assert "kept the plan's setting over the chain's B* (the timeout): slm 1, llm 1" in res.stdout
    plan = read_plan(out)
    assert plan["models"]["llm"]["batch"] == 1 and plan["tuning"]["result"]["best"] == {"slm": 1, "llm": 1}
    check = plan["tuning"]["timeout_check"]
    assert check["kept"] == "current" and check["current_tok_s"] > check["best_tok_s"] * 1.01


def test_tune_delay_chooses_the_timeout_with_the_thresholds(tmp_path):
    """`--tune-delay` on the plan above (B* = (1, 3) serves worse than (1, 1) at its 10 ms timeout): the chain's
    best thresholds and the plan's are simulated at 10-160 ms, and the pair written serves more than 1 % above
    every pair at a shorter timeout; the tuned plan holds the timeout, the record every simulation."""
    src = write(tmp_path, R2R_LIKE.replace("concurrency: 4", "concurrency: 4, max_delay_ms: 10"))
    out = tmp_path / "out.plan"
    args = ["--step-ms", "slm=6.0", "--step-ms", "llm=27.9", "--tune-delay", "-o", str(out)]
    res = runner.invoke(app, ["tune", src, *args])
    assert res.exit_code == 0, res.output
    plan = read_plan(out)
    search = plan["tuning"]["timeout_search"]
    sims = {(tuple(x["thresholds"].values()), x["max_delay_ms"]): x["tok_s"] for x in search["simulated"]}
    assert {d for _, d in sims} == {10.0, 20.0, 40.0, 80.0, 160.0} and (1, 1) in {b for b, _ in sims}
    chosen, delay = tuple(search["best"].values()), search["max_delay_ms"]
    assert delay > 10.0 and chosen == (1, 3)  # B* gathers its batches once the timeout allows it
    assert all(search["best_tok_s"] > t * 1.01 for (_, d), t in sims.items() if d < delay)
    assert plan["serve"]["max_delay_ms"] == delay and plan["models"]["llm"]["batch"] == 3
    assert "timeout_check" not in plan["tuning"]
    assert f"chosen: slm 1, llm 3 with max_delay_ms = {delay:g}" in res.stdout
    assert "timeout search: 4 settings simulated at max_delay_ms = 10, 20, 40, 80, 160" in res.stderr
    rate = runner.invoke(app, ["tune", src, *args, "--request-rate", "1", "--request-tokens", "8"])
    assert rate.exit_code == 2 and "--tune-delay goes with the closed-loop tuning" in rate.output


def test_tune_refuses_where_the_better_plan_setting_is_beyond_the_chains_state_limit(tmp_path):
    """At --max-states 100 the chain evaluates (1, 2..4) but not the plan's (1, 1) (715 states): that is said
    next to the candidate, and where the simulation prefers (1, 1) nothing is written, with the reason."""
    args = ["--step-ms", "slm=6.0", "--step-ms", "llm=27.9", "--max-states", "100"]
    out = tmp_path / "out.plan"
    res = runner.invoke(app, ["tune", write(tmp_path, R2R_LIKE), *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "not evaluated: B = 1,1 (the plan's setting): the chain has more than 100 states" in res.stdout
    slow = write(tmp_path, R2R_LIKE.replace("concurrency: 4", "concurrency: 4, max_delay_ms: 10"), "slow.tr")
    res = runner.invoke(app, ["tune", slow, *args, "-o", str(tmp_path / "slow.plan")])
    assert res.exit_code == 1 and not (tmp_path / "slow.plan").exists()
    assert (
        "the plan's setting serves better, but the chain could not evaluate it (the chain has more than 100"
        in (res.stderr)
    )
    assert "the plan was not written" in res.stderr and "Traceback" not in res.output


def test_tune_plot_writes_png(tmp_path):
    src = write(tmp_path, R2R_LIKE)
    png = tmp_path / "t.png"
    res = runner.invoke(
        app,
        [
            "tune",
            src,
            "--step-ms",
            "slm=6",
            "--step-ms",
            "llm=27.9",
            "--plot",
            str(png),
            "-o",
            str(tmp_path / "x.plan"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tune_refuses_infeasible_fixed_thresholds_like_check(tmp_path):
    src = write(tmp_path, FIXED)
    res = runner.invoke(app, ["tune", src, "-n", "2", "--step-ms", "slm=6", "--step-ms", "llm=27.9"])
    assert res.exit_code == 1
    assert feasibility_error({"slm": 2, "llm": 2}, 2) in res.output
    assert "Traceback" not in res.output


def test_tune_errors_are_messages_with_exit_codes(tmp_path):
    src = write(tmp_path, R2R_LIKE)
    res = runner.invoke(app, ["tune", src, "--step-ms", "slm=6"])
    assert res.exit_code == 1 and "no step latency for llm" in res.output
    res = runner.invoke(app, ["tune", src, "--step-ms", "slm=6", "--step-ms", "llm=x"])
    assert res.exit_code == 2 and "bad --step-ms" in res.output
    res = runner.invoke(app, ["tune", str(tmp_path / "missing.plan"), "--step-ms", "slm=6"])
    assert res.exit_code == 1 and "no such plan file" in res.output


def test_simulate_reports_throughput_and_chain(tmp_path):
    src = write(tmp_path, R2R_LIKE)
    res = runner.invoke(app, ["simulate", src, "--step-ms", "slm=6", "--step-ms", "llm=27.9", "--batch", "llm=3",
                              "--horizon-ms", "20000", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    sim, chain = data["simulation"]["throughput_tok_s"], data["chain"]["throughput_tok_s"]
    assert chain == pytest.approx(207.95, abs=0.01)
    assert sim == pytest.approx(chain, rel=0.03)
    res = runner.invoke(app, ["simulate", src, "--step-ms", "slm=6", "--step-ms", "llm=27.9"])
    assert res.exit_code == 1 and "batch: auto" in res.output


def test_simulate_think_times_and_bursts_lower_throughput(tmp_path):
    src = write(tmp_path, R2R_LIKE)
    base = ["simulate", src, "--step-ms", "slm=6", "--step-ms", "llm=27.9", "--batch", "llm=3", "--horizon-ms", "20000",
            "--json", "--max-delay-ms", "5"]  # fmt: skip
    closed = json.loads(runner.invoke(app, base).output)["simulation"]
    thinking = json.loads(
        runner.invoke(app, [*base, "--request-tokens", "50", "--think-ms", "200", "--burstiness", "4"]).output
    )["simulation"]
    assert thinking["finished_requests"] > 10
    assert not thinking["stalled"]
    assert thinking["throughput_tok_s"] < closed["throughput_tok_s"]


def test_simulate_takes_a_hops_delay_into_each_model(tmp_path):
    """`--hop-ms MODEL=MS`: hops reach MODEL that long after the sender's step (instant by default); the chain,
    which takes hops as instant, is not shown beside it. Bad values get a usage error naming the option."""
    src = write(tmp_path, R2R_LIKE)
    base = [
        "simulate",
        src,
        "--step-ms",
        "slm=6",
        "--step-ms",
        "llm=27.9",
        "--batch",
        "llm=3",
        "--horizon-ms",
        "20000",
    ]
    instant = json.loads(runner.invoke(app, [*base, "--json"]).output)
    delayed = json.loads(
        runner.invoke(app, [*base, "--json", "--hop-ms", "llm=2", "--hop-ms", "slm=2"]).output
    )
    assert "chain" in instant and "chain" not in delayed
    assert delayed["simulation"]["throughput_tok_s"] < 0.97 * instant["simulation"]["throughput_tok_s"]
    res = runner.invoke(app, [*base, "--hop-ms", "llm=2"])
    assert res.exit_code == 0 and "hop delay into each model: slm 0 ms, llm 2 ms" in res.output
    for bad, msg in (("llm", "expected MODEL=MS"), ("llm=x", "is not a number"), ("llm=-1", "ms >= 0")):
        res = runner.invoke(app, [*base, "--hop-ms", bad])
        assert res.exit_code == 2 and msg in res.output, res.output
    res = runner.invoke(app, [*base, "--hop-ms", "big=1"])
    assert res.exit_code == 1 and "unknown model 'big'" in res.output


def test_a_step_gap_is_a_longer_step_in_the_chain(tmp_path):
    """`tune --gap-ms MODEL=MS` adds the host gap to every step of MODEL in the chain: the same choice and T as the
    latencies given that much longer, recorded apart (`tuning.gap_ms`) beside the latencies as measured; the
    simulator's chain line takes the same gap. `--gap-ms profile`: the profile's `workload.gap_ms`."""
    from tokenrouter.throughput.inputs import StepLatency
    from tokenrouter.throughput.profile_format import Profile, write_profile

    src = write(tmp_path, R2R_LIKE)
    tune = ["tune", src, "--json", "--top", "20"]
    gap = json.loads(runner.invoke(app, [*tune, "--step-ms", "slm=6", "--step-ms", "llm=27.9",
                                         "--gap-ms", "slm=1.5", "--gap-ms", "llm=0.5"]).stdout)["tuning"]  # fmt: skip
    longer = json.loads(runner.invoke(app, [*tune, "--step-ms", "slm=7.5", "--step-ms", "llm=28.4"]).stdout)[
        "tuning"
    ]
    bare = json.loads(runner.invoke(app, [*tune, "--step-ms", "slm=6", "--step-ms", "llm=27.9"]).stdout)[
        "tuning"
    ]
    assert gap["result"]["candidates"] == longer["result"]["candidates"]
    assert gap["gap_ms"] == {"slm": 1.5, "llm": 0.5} and "gap_ms" not in bare
    assert gap["step_ms"] == bare["step_ms"] == {"slm": [[1, 6.0]], "llm": [[1, 27.9]]}
    assert gap["result"]["throughput_tok_s"] < 0.95 * bare["result"]["throughput_tok_s"]
    text = runner.invoke(app, [*tune[:2], "--step-ms", "slm=6", "--step-ms", "llm=27.9", "--gap-ms", "slm=1.5",
                               "-o", str(tmp_path / "g.plan")])  # fmt: skip
    assert text.exit_code == 0, text.output
    assert (
        "host time per step beyond its latency: slm 1.5 ms, llm 0 ms (added to every step in the chain)"
        in text.output
    )

    sim = ["simulate", src, "--batch", "llm=3", "--horizon-ms", "20000", "--json"]
    with_gap = json.loads(runner.invoke(app, [*sim, "--step-ms", "slm=6", "--step-ms", "llm=27.9",
                                              "--gap-ms", "slm=1.5", "--gap-ms", "llm=0.5"]).stdout)  # fmt: skip
    as_longer = json.loads(runner.invoke(app, [*sim, "--step-ms", "slm=7.5", "--step-ms", "llm=28.4"]).stdout)
    assert with_gap["chain"]["throughput_tok_s"] == pytest.approx(as_longer["chain"]["throughput_tok_s"])
    assert with_gap["simulation"]["throughput_tok_s"] == pytest.approx(
        with_gap["chain"]["throughput_tok_s"], rel=0.03
    )

    step = {"slm": StepLatency(((1, 6.0),)), "llm": StepLatency(((1, 27.9),))}
    routing = {"slm": {"slm": 0.65, "llm": 0.35}, "llm": {"slm": 1.0}}
    write_profile(Profile("r2rlike", None, step, routing, workload={"gap_ms": {"slm": 1.5, "llm": 0.5}}),
                  tmp_path / "gaps.json")  # fmt: skip
    write_profile(Profile("r2rlike", None, step, routing), tmp_path / "none.json")
    prof = json.loads(
        runner.invoke(app, [*tune, "--profile", str(tmp_path / "gaps.json"), "--gap-ms", "profile"]).stdout
    )
    assert prof["tuning"]["gap_ms"] == {"slm": 1.5, "llm": 0.5}
    assert prof["tuning"]["result"]["candidates"] == gap["result"]["candidates"]
    text = runner.invoke(
        app, ["tune", src, "--profile", str(tmp_path / "gaps.json"), "-o", str(tmp_path / "h.plan")]
    )
    assert (
        "note: the profile measured host time between back-to-back steps (slm 1.5 ms, llm 0.5 ms)"
        in text.stdout
    )
    assert "hops took" not in text.stdout
    write_profile(
        Profile("r2rlike", None, step, routing, workload={"hop_ms": {"llm": 2.0}}), tmp_path / "hops.json"
    )
    text = runner.invoke(
        app, ["tune", src, "--profile", str(tmp_path / "hops.json"), "-o", str(tmp_path / "h.plan")]
    )
    best = float(text.stdout.split("(T = ")[1].split(" tok/s")[0])
    served = float(text.stdout.split("with that transit B* serves about ")[1].split(" tok/s")[0])
    assert "note: the profile's hops took 2 ms into llm, which the chain takes as instant" in text.stdout
    assert 0.9 * best < served < best
    res = runner.invoke(app, [*tune, "--profile", str(tmp_path / "none.json"), "--gap-ms", "profile"])
    assert res.exit_code == 1 and "--gap-ms profile: the profile has no step gaps" in res.output, res.output
    given = [*tune, "--step-ms", "slm=6", "--step-ms", "llm=27.9"]
    res = runner.invoke(app, [*given, "--gap-ms", "slm=-1"])
    assert res.exit_code == 2 and "--gap-ms" in res.output, res.output
    res = runner.invoke(app, [*given, "--gap-ms", "profile"])
    assert res.exit_code == 2 and "--gap-ms profile takes the step gaps of --profile FILE" in res.output, (
        res.output
    )
    res = runner.invoke(app, [*given, "--gap-ms", "slm=0.2", "--gap-ms", "slm=0.3"])
    assert res.exit_code == 2 and "--gap-ms gives slm twice (slm=0.2 and 'slm=0.3')" in res.output, res.output


def test_tune_skips_candidates_over_the_state_cap(tmp_path):
    src = write(tmp_path, R2R_LIKE)
    res = runner.invoke(app, ["tune", src, "--step-ms", "slm=6", "--step-ms", "llm=27.9", "--max-states", "20",
                              "-o", str(tmp_path / "o.plan")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "not evaluated: B = 1,1 (the plan's setting): the chain has more than 20 states" in res.output
    assert "B* = slm 1, llm 3" in res.output  # 14 states: still evaluated


def test_simulate_replays_a_bench_report_as_a_finite_run(tmp_path):
    """`--requests`: the load generator's per-request records, each request with its own routing. One at a
    time, 10 tokens each: a request that never hops (10 steps of 1 ms) and one that hops on every token (a
    dropped 1 ms step, then a 10 ms step of llm): 120 ms for 20 tokens, exactly (routing certain)."""
    src = write(tmp_path, R2R_LIKE)
    report = {"spec": {"output_len": 10}, "per_request": [
        {"ok": True, "hops": 0, "tokens_per_model": {"slm": 10}},
        {"ok": True, "hops": 20, "tokens_per_model": {"llm": 10}},
        {"ok": False, "hops": 0, "tokens_per_model": {}}]}  # fmt: skip
    (tmp_path / "bench.json").write_text(json.dumps(report))
    base = ["simulate", src, "-n", "1", "--step-ms", "slm=1", "--step-ms", "llm=10", "--batch", "llm=1"]
    res = runner.invoke(app, [*base, "--requests", str(tmp_path / "bench.json"), "--json"])
    assert res.exit_code == 0, res.output
    sim = json.loads(res.stdout)["simulation"]
    assert sim["simulated_ms"] == pytest.approx(120.0) and sim["finished_requests"] == 2
    assert sim["throughput_tok_s"] == pytest.approx(20 / 0.120)
    assert "chain" not in json.loads(res.stdout)  # not the chain's closed system
    text = runner.invoke(app, [*base, "--requests", str(tmp_path / "bench.json")]).output
    assert "a finite run of 2 requests" in text and "to the last one's end: 0.120 s" in text
    assert "warning" not in text
    cut = runner.invoke(app, [*base, "--requests", str(tmp_path / "bench.json"), "--horizon-ms", "50"]).output
    assert "finished requests: 1" in cut and "warning: the run was cut at --horizon-ms 50" in cut
    (tmp_path / "old.json").write_text(json.dumps({"spec": {"output_len": 10}, "tokens_per_model": {}}))
    for name, msg in (("old.json", "no per_request records"), ("missing.json", "no such file")):
        res = runner.invoke(app, [*base, "--requests", str(tmp_path / name)])
        assert res.exit_code == 1 and msg in res.output and "Traceback" not in res.output
    del report["spec"]
    (tmp_path / "nolen.json").write_text(json.dumps(report))
    res = runner.invoke(app, [*base, "--requests", str(tmp_path / "nolen.json")])
    assert res.exit_code == 2 and "--request-tokens" in res.output


def test_simulate_replays_each_request_at_the_length_it_ran(tmp_path):
    """A report whose requests ran different lengths (a .jsonl load's output_len, or EOS): the replay gives each
    its own, 10 tokens that never hop and 3 that hop every token: 10 + 33 ms; --request-tokens gives every
    request that many instead (120 ms, as when all ran 10)."""
    src = write(tmp_path, R2R_LIKE)
    report = {"spec": {"output_len": 10}, "per_request": [
        {"ok": True, "hops": 0, "output_tokens": 10, "tokens_per_model": {"slm": 10}},
        {"ok": True, "hops": 6, "output_tokens": 3, "tokens_per_model": {"llm": 3}}]}  # fmt: skip
    (tmp_path / "bench.json").write_text(json.dumps(report))
    base = ["simulate", src, "-n", "1", "--step-ms", "slm=1", "--step-ms", "llm=10", "--batch", "llm=1",
            "--requests", str(tmp_path / "bench.json")]  # fmt: skip
    res = runner.invoke(app, [*base, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["simulation"]["simulated_ms"] == pytest.approx(43.0)
    text = runner.invoke(app, base).output
    assert "a finite run of 2 requests" in text and "3-10 tokens, each its own length and routing" in text
    fixed = runner.invoke(app, [*base, "--request-tokens", "10", "--json"])
    assert json.loads(fixed.stdout)["simulation"]["simulated_ms"] == pytest.approx(120.0)


def test_tune_warns_when_the_chosen_steps_are_beyond_the_measured_latencies(tmp_path):
    """A step latency is held at its largest batch size's beyond it: where the chosen threshold (or the chain's
    mean batch) is above the largest measured batch size, tune says so; measured further, the warning goes and
    the choice moves down (seen on the H200: B_llm = 12 chosen on latencies measured up to 10 rows)."""
    src = write(
        tmp_path, R2R_LIKE.replace("batch: 1", "batch: auto").replace("concurrency: 4", "concurrency: 8")
    )
    slm = ["--step-ms", "slm=1:1.5,2:1.6,4:1.8,8:2.2"]
    res = runner.invoke(app, ["tune", src, *slm, "--step-ms", "llm=1:6,2:6.2,3:6.4", "--json"])
    assert res.exit_code == 0, res.output
    tuning = json.loads(res.stdout)["tuning"]
    assert tuning["result"]["best"] == {"slm": 1, "llm": 4}
    best = next(c for c in tuning["result"]["candidates"] if c["thresholds"] == {"slm": 1, "llm": 4})
    (line,) = [w for w in tuning["warnings"] if "measured up to" in w]
    assert line.startswith("B_llm = 4: llm's step latency was measured up to 3 rows")
    assert "at that size's 6.40 ms" in line and f"average {best['mean_batch']['llm']:.1f} rows" in line
    assert f"warning: {line}" in res.stderr
    res = runner.invoke(app, ["tune", src, *slm, "--step-ms", "llm=1:6,2:6.2,3:6.4,8:9", "--json"])
    tuning = json.loads(res.stdout)["tuning"]
    assert tuning["result"]["best"] == {"slm": 1, "llm": 3}
    assert not [w for w in tuning.get("warnings", []) if "measured up to" in w]
    # a latency given as one constant is not a measurement that stops somewhere
    res = runner.invoke(app, ["tune", src, "--step-ms", "slm=1.5", "--step-ms", "llm=6", "--json"])
    assert not [w for w in json.loads(res.stdout)["tuning"].get("warnings", []) if "measured up to" in w]


def test_tune_checks_the_plot_name_before_the_plan_is_written(tmp_path):
    src = write(tmp_path, R2R_LIKE)
    out = tmp_path / "x.plan"
    args = ["tune", src, "--step-ms", "slm=6", "--step-ms", "llm=27.9", "-o", str(out), "--plot"]
    for plot, message in (
        (tmp_path / "t.txt", "--plot takes a .png file name"),
        (tmp_path / "t", "--plot takes a .png file name"),  # matplotlib would have written t.png
        (tmp_path / "no" / "t.png", f"no folder {tmp_path / 'no'}"),
    ):
        res = runner.invoke(app, [*args, str(plot)])
        assert res.exit_code == 2 and message in res.stderr, res.output
        assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
        assert not out.exists()


def test_delta_ms_is_checked_against_the_step_latencies(tmp_path):
    """δ longer than the shortest step rounds every step to one tick (T = 0.00 tok/s at δ = 1e9 ms): refused,
    in `tune` and in `simulate`'s chain alike, before the plan is written or anything is simulated."""
    src = write(tmp_path, R2R_LIKE)
    out = tmp_path / "x.plan"
    steps = ["--step-ms", "slm=6", "--step-ms", "llm=27.9"]
    res = runner.invoke(app, ["tune", src, *steps, "-o", str(out), "--delta-ms", "1e9"])
    assert res.exit_code == 2 and not out.exists(), res.output
    assert "--delta-ms 1e+09 is longer than the shortest step (slm at batch size 1: 6 ms)" in res.stderr
    res = runner.invoke(app, ["tune", src, *steps, "-o", str(out), "--delta-ms", "inf"])
    assert res.exit_code == 2 and "--delta-ms must be a finite number of ms > 0, got inf" in res.stderr
    sim = ["simulate", src, *steps, "--batch", "llm=3", "--horizon-ms", "100"]
    res = runner.invoke(app, [*sim, "--delta-ms", "0"])
    assert res.exit_code == 2 and "--delta-ms must be a finite number of ms > 0, got 0.0" in res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    res = runner.invoke(app, [*sim, "--delta-ms", "7"])
    assert res.exit_code == 2 and "--delta-ms 7 is longer than the shortest step" in res.stderr
    assert runner.invoke(app, [*sim, "--delta-ms", "7", "--no-chain"]).exit_code == 0


def test_simulate_and_profile_refuse_a_negative_seed(tmp_path):
    src = write(tmp_path, R2R_LIKE)
    res = runner.invoke(app, ["simulate", src, "--step-ms", "slm=6", "--step-ms", "llm=27.9", "--batch", "llm=3",
                              "--seed", "-1"])  # fmt: skip
    assert res.exit_code == 2 and "seed must be an int >= 0, got -1" in res.stderr, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    res = runner.invoke(app, ["profile", src, "--seed", "-1", "-o", str(tmp_path / "p.json")])
    assert res.exit_code == 2 and "seed must be an int >= 0, got -1" in res.stderr, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception


def test_simulate_refuses_a_horizon_it_could_not_finish(tmp_path):
    """Left alone, `--horizon-ms 1e15` ran for ever: the steps it could take are bounded (MAX_SIM_STEPS)."""
    src = write(tmp_path, R2R_LIKE)
    res = runner.invoke(app, ["simulate", src, "--step-ms", "slm=6", "--step-ms", "llm=27.9", "--batch", "llm=3",
                              "--horizon-ms", "1e15"])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "--horizon-ms 1e+15 after --warmup-ms 2000 could take up to 2.03e+14 steps" in res.stderr
    assert "give --horizon-ms 4.93803e+08 or less" in res.stderr


def test_tune_samples_a_chain_too_large_without_building_it(tmp_path):
    """At N requests the entry model's first batch alone routes N + 1 ways: where that is over the exact chain's
    limit the chain is not built (at N = 10^8, before -n had a bound, building it ran past a minute) but sampled
    (`large_n.py`), at once."""
    import time

    src = write(tmp_path, FIXED.replace("batch: 2", "batch: 1"))
    t0 = time.perf_counter()
    res = runner.invoke(app, ["tune", src, "--step-ms", "slm=1", "--step-ms", "llm=5", "-n", "65536",
                              "--max-states", "1000", "-o", str(tmp_path / "o.plan")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "sampled search: 1 of 1 feasible candidates" in res.stdout
    assert time.perf_counter() - t0 < 20


def test_concurrency_beyond_a_plans_bound_is_refused_at_once(tmp_path):
    """-n takes the bound a plan's `serve { concurrency }` has (65,536): `simulate -n 1e8` ran for minutes in
    the simulator, and the chain's state bound did not cover it."""
    src = write(tmp_path, R2R_LIKE)
    for cmd in (["simulate", src, "--batch", "llm=1"], ["tune", src, "-o", str(tmp_path / "o.plan")]):
        res = runner.invoke(app, [*cmd, "--step-ms", "slm=1", "--step-ms", "llm=5", "-n", "100000000"])
        assert (
            res.exit_code != 0 and "concurrency N must be an int in [1, 65536], got 100000000" in res.output
        )
        assert "Traceback" not in res.output and not (tmp_path / "o.plan").exists()
