"""The co-location term: fitted from two served profiles (`profile --colocation`), solved as a fixed point in
the chain, and measured from the chain at the profile's own thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.compiler.driver import compile_source
from tokenrouter.compiler.plan import co_runners
from tokenrouter.throughput.colocation import ColocationError, fit
from tokenrouter.throughput.dtmc import analyze
from tokenrouter.throughput.inputs import ColocationTerm, StepLatency, SystemInputs
from tokenrouter.throughput.plan_inputs import ThroughputInputError, system_from_plan
from tokenrouter.throughput.profile_format import (
    Profile,
    ProfileError,
    read_profile,
    write_profile,
)

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
ONE_GPU = {"models": {"slm": {"gpus": [0]}, "llm": {"gpus": [0]}}}


def bernoulli_plan() -> dict:
    src = (ROOT / "examples" / "bernoulli.tr").read_text()
    src = src.replace("batch: slm_batch", "batch: auto").replace("batch: llm_batch", "batch: auto")
    result = compile_source(src, str(ROOT / "examples" / "bernoulli.tr"))
    assert result.plan is not None, [str(d) for d in result.diagnostics]
    return result.plan


def bernoulli_source(tmp_path: Path) -> Path:
    """examples/bernoulli.tr with the large model's threshold `auto`, its model paths absolute."""
    plan = tmp_path / "b.tr"
    src = (ROOT / "examples" / "bernoulli.tr").read_text().replace("batch: llm_batch", "batch: auto")
    plan.write_text(src.replace("models/", str(ROOT / "examples" / "models") + "/"))
    return plan


def profile(slm: dict[int, float], llm: dict[int, float], busy: dict[str, float], **workload) -> Profile:
    """A served profile of the bernoulli pair (p = 0.1)."""
    return Profile(
        policy="bernoulli",
        source_sha256=None,
        step_ms={"slm": StepLatency(tuple(slm.items())), "llm": StepLatency(tuple(llm.items()))},
        routing={"slm": {"slm": 0.9, "llm": 0.1}, "llm": {"slm": 1.0}},
        counts={"slm": {"slm": 900, "llm": 100}, "llm": {"slm": 100}},
        workload={"busy_share": busy, "source": "metrics", **workload},
    )


# a served 0.6B + 8B's shape (H200): the 8B busy 0.69 of the time at B = (1, 1), 0.45 at (1, 3); the 0.6B's
# steps 0.35 ms shorter
EAGER = profile({1: 2.3, 2: 2.5}, {1: 6.5}, {"slm": 0.40, "llm": 0.69}, thresholds={"slm": 1, "llm": 1},
                steps={"slm": {"1": 1000, "2": 100}, "llm": {"1": 300}})  # fmt: skip
B3 = profile({1: 1.95, 2: 2.15, 3: 2.3}, {1: 6.4, 2: 6.6, 3: 6.9}, {"slm": 0.42, "llm": 0.45},
             thresholds={"slm": 1, "llm": 3}, steps={"slm": {"1": 800, "2": 300, "3": 10}, "llm": {"1": 50}})  # fmt: skip


def test_co_runners_follow_the_gpus():
    plan = {"models": {"a": {"gpus": [0]}, "b": {"gpus": [0, 1]}, "c": {"gpus": [1]}, "d": {}}}
    assert co_runners(plan) == {"a": ["b", "d"], "b": ["a", "c", "d"], "c": ["b"], "d": ["a", "b"]}


def test_fit_is_the_step_change_over_the_co_runners_busy_change():
    got = fit(ONE_GPU, EAGER, B3)
    term = got.colocation["slm"]
    # the 0.6B's step at batch sizes 1 and 2, weighted by the steps behind the fewer of the two: (800 × -0.35
    # + 100 × -0.35) / 900 = -0.35 ms as the 8B's busy share fell by 0.24
    assert term["co_runners"] == ["llm"] and term["at_share"] == 0.69
    assert term["ms_per_share"] == pytest.approx(0.35 / 0.24, abs=1e-4)
    assert term["fit"]["batch_sizes"] == [1, 2] and term["fit"]["busy_share"] == [0.69, 0.45]
    assert term["fit"]["thresholds"] == [{"slm": 1, "llm": 1}, {"slm": 1, "llm": 3}]
    # the 0.6B's busy share barely changed (0.40 → 0.42): the 8B gets no term, and the profile says so
    assert "llm" not in got.colocation
    assert got.workload["colocation_unfitted"] == ["llm (slm busy 0.40 and 0.42)"]
    # the rest is the first profile, with both profiles' routing decisions pooled
    assert got.step_ms == EAGER.step_ms and got.workload["busy_share"] == EAGER.workload["busy_share"]
    assert got.counts["slm"] == {"slm": 1800, "llm": 200} and got.routing["slm"] == pytest.approx(
        {"slm": 0.9, "llm": 0.1}
    )


def test_fit_weights_batch_sizes_by_their_steps_and_clamps_a_negative_slope():
    a = profile({1: 2.0, 2: 2.0}, {1: 6.0}, {"slm": 0.4, "llm": 0.8}, steps={"slm": {"1": 10, "2": 30}})
    b = profile({1: 1.0, 2: 1.8}, {1: 6.0}, {"slm": 0.4, "llm": 0.6}, steps={"slm": {"1": 90, "2": 30}})
    term = fit(ONE_GPU, a, b).colocation["slm"]
    assert term["fit"]["step_change_ms"] == pytest.approx((10 * -1.0 + 30 * -0.2) / 40)
    # steps longer while the co-runner is less busy: noise, not a speed-up; the term is 0
    c = profile({1: 2.5, 2: 2.5}, {1: 6.0}, {"slm": 0.4, "llm": 0.6})
    term = fit(ONE_GPU, a, c).colocation["slm"]
    assert term["ms_per_share"] == 0.0 and term["fit"]["slope_ms_per_share"] == pytest.approx(-2.5)


def test_fit_errors_say_what_to_do():
    with pytest.raises(ColocationError, match="no two models of the plan share a GPU"):
        fit({"models": {"slm": {"gpus": [0]}, "llm": {"gpus": [1]}}}, EAGER, B3)
    close = profile({1: 2.2}, {1: 6.5}, {"slm": 0.41, "llm": 0.67})
    with pytest.raises(ColocationError, match=r"about as busy in both profiles .*serve --batch MODEL=3"):
        fit(ONE_GPU, EAGER, close)
    old = profile({1: 2.2}, {1: 6.5}, {})
    with pytest.raises(ColocationError, match="the second profile records no busy share"):
        fit(ONE_GPU, EAGER, old)
    disjoint = profile({4: 2.2}, {1: 6.5}, {"slm": 0.4, "llm": 0.3})
    with pytest.raises(ColocationError, match=r"model 'slm': no batch size ran often enough in both"):
        fit(ONE_GPU, EAGER, disjoint)


def pair(slm_ms: float, term: ColocationTerm | None) -> SystemInputs:
    p = np.array([[0.9, 0.1], [1.0, 0.0]])
    return SystemInputs(
        ("slm", "llm"),
        (StepLatency(((1, slm_ms), (8, slm_ms + 0.8))), StepLatency(((1, 6.5), (8, 8.0)))),
        p,
        np.ones((2, 2)),
        8,
        colocation=(term, None) if term else (),
    )


def test_solve_settles_on_a_consistent_shift():
    plain = analyze(pair(2.3, None), (1, 3))
    # a zero term is the plain chain
    zero = analyze(pair(2.3, ColocationTerm((1,), 0.0, 0.5)), (1, 3))
    assert zero.throughput == pytest.approx(plain.throughput) and zero.step_shift_ms == (0.0, 0.0)
    # a term measured where the large model was busier than it is here: the small model's step shortens
    term = ColocationTerm((1,), 1.5, plain.utilization[1] + 0.2)
    res = analyze(pair(2.3, term), (1, 3))
    assert res.throughput > plain.throughput
    shift = res.step_shift_ms[0]
    assert shift < 0 and res.step_shift_ms[1] == 0.0
    # the fixed point: the shift is the term at the utilization the chain ends at
    assert shift == pytest.approx(1.5 * (res.utilization[1] - term.at_share), abs=0.01)
    # the same as the plain chain with the small model's latencies moved by that shift
    moved = analyze(pair(2.3 + shift, None), (1, 3))
    assert moved.throughput == pytest.approx(res.throughput, rel=1e-6)
    assert res.as_dict(("slm", "llm"))["step_shift_ms"] == {"slm": shift, "llm": 0.0}
    assert "step_shift_ms" not in plain.as_dict(("slm", "llm"))


def test_terms_are_checked():
    with pytest.raises(ValueError, match="at least one co-runner"):
        ColocationTerm((), 1.0, 0.5)
    with pytest.raises(ValueError, match="ms_per_share must be a finite number >= 0"):
        ColocationTerm((1,), -1.0, 0.5)
    with pytest.raises(ValueError, match="co-runners of slm must be other models"):
        pair(2.3, ColocationTerm((0,), 1.0, 0.5))


def test_the_term_is_put_on_the_chains_scale():
    """The served busy share runs below the chain's utilization (host gaps, a benchmark's ramp and drain), so
    the tuner re-expresses the term in the chain's units: the reference is the co-runners' utilization in the
    plain chain at the first profile's thresholds, the slope the measured step change over that
    utilization's change at the second's. The first profile's thresholds then predict what the plain chain
    does, and the second's step moves by what was measured; it applies only where the profile gave the step
    latencies."""
    plan = bernoulli_plan()
    fitted = fit(plan, EAGER, B3)
    system = system_from_plan(plan, 8, profile=fitted)
    plain = system_from_plan(plan, 8, profile=EAGER)
    term = system.inputs.colocation[0]
    assert system.inputs.colocation[1] is None and term.co_runners == (1,)
    at = analyze(plain.inputs, (1, 1)).utilization[1]
    to = analyze(plain.inputs, (1, 3)).utilization[1]
    assert at - to > 0.2  # the chain's 8B is busy less at B_llm = 3, as it was served
    assert term.at_share == pytest.approx(at)
    assert term.ms_per_share == pytest.approx(0.35 / (at - to), abs=1e-4)
    # the measured shares moved by 0.24, the chain's by more: the slope on its scale is the smaller
    assert term.ms_per_share < fitted.colocation["slm"]["ms_per_share"]
    assert system.sources["colocation"] == {"slm": "profile (from the chain at B = (1, 1) and (1, 3))"}
    assert system.warnings == []
    assert analyze(system.inputs, (1, 1)).throughput == pytest.approx(
        analyze(plain.inputs, (1, 1)).throughput
    )
    res = analyze(system.inputs, (1, 3))
    assert res.throughput > analyze(plain.inputs, (1, 3)).throughput
    # at B_llm = 3 the 0.6B's step moves by the measured -0.35 ms, less what the 8B's own change of
    # utilization under the shift makes of it
    assert res.step_shift_ms[0] == pytest.approx(-0.35, abs=0.05)
    # without the second profile's thresholds: the reference from the chain, the slope as measured
    one = fit(plan, EAGER, profile({1: 1.95, 2: 2.15}, {1: 6.4}, {"slm": 0.42, "llm": 0.45}))
    system = system_from_plan(plan, 8, profile=one)
    assert system.inputs.colocation[0].at_share == pytest.approx(at)
    assert system.inputs.colocation[0].ms_per_share == one.colocation["slm"]["ms_per_share"]
    assert system.sources["colocation"]["slm"].startswith("profile (reference from the chain at B = (1, 1);")
    # without the served thresholds, the measured busy share is the reference
    bare = fit(plan, profile({1: 2.3, 2: 2.5}, {1: 6.5}, {"slm": 0.4, "llm": 0.69}), B3)
    system = system_from_plan(plan, 8, profile=bare)
    assert system.inputs.colocation[0].at_share == 0.69
    assert system.sources["colocation"] == {"slm": "profile (from the measured busy share)"}
    # step latencies given on the command line replace the profile's: its term does not apply to them
    system = system_from_plan(plan, 8, step_ms={"slm": StepLatency(((1, 2.0),))}, profile=fitted)
    assert system.inputs.colocation == () and "colocation" not in system.sources
    # a term that names a model the plan lacks
    fitted.colocation["slm"] = {**fitted.colocation["slm"], "co_runners": ["big"]}
    with pytest.raises(ThroughputInputError, match="co-location term of slm names 'big'"):
        system_from_plan(plan, 8, profile=fitted)


def test_a_term_the_chain_cannot_scale_is_left_out_with_a_warning():
    """Served at (2, 1) and (1, 1) the 8B is busy 0.69 and 0.45 of the time by the server's clock (a noisy
    pair), but the chain keeps it as busy at both: the term cannot be put on its scale, and tune says so."""
    plan = bernoulli_plan()
    other = profile({1: 1.95, 2: 2.15}, {1: 6.4}, {"slm": 0.42, "llm": 0.45}, thresholds={"slm": 2, "llm": 1})
    fitted = fit(plan, EAGER, other)
    system = system_from_plan(plan, 8, profile=fitted)
    assert system.inputs.colocation == () and system.sources.get("colocation", {}) == {}
    (line,) = system.warnings
    assert line.startswith(
        "the co-location term of slm is left out: the chain keeps llm as busy at B = (1, 1)"
    )
    assert "(-0.350 ms) cannot be put on the chain's scale" in line


def test_tune_prints_the_left_out_term(tmp_path):
    plan = bernoulli_source(tmp_path)
    other = profile({1: 1.95, 2: 2.15}, {1: 6.4}, {"slm": 0.42, "llm": 0.45}, thresholds={"slm": 2, "llm": 1})
    write_profile(fit(bernoulli_plan(), EAGER, other), tmp_path / "p.json")
    res = runner.invoke(app, ["tune", str(plan), "--profile", str(tmp_path / "p.json"), "-n", "8", "--json"])
    assert res.exit_code == 0, res.output
    assert "warning: the co-location term of slm is left out" in res.stderr
    tuning = json.loads(res.stdout)["tuning"]
    assert tuning["warnings"][0].startswith("the co-location term of slm is left out")
    assert "colocation" not in tuning


def test_profile_files_keep_and_check_the_term(tmp_path):
    path = tmp_path / "p.json"
    write_profile(fit(ONE_GPU, EAGER, B3), path)
    back = read_profile(path)
    assert back.colocation["slm"]["ms_per_share"] == pytest.approx(0.35 / 0.24, abs=1e-4)
    data = json.loads(path.read_text())
    for bad in ({"slm": {"co_runners": [], "ms_per_share": 1, "at_share": 0.5}},
                {"slm": {"co_runners": ["llm"], "ms_per_share": -1, "at_share": 0.5}},
                {"slm": {"co_runners": ["llm"], "ms_per_share": True, "at_share": 0.5}},
                {"slm": {"co_runners": ["llm"], "ms_per_share": 1}}, ["slm"]):  # fmt: skip
        path.write_text(json.dumps({**data, "colocation": bad}))
        with pytest.raises(ProfileError, match="colocation"):
            read_profile(path)
    write_profile(EAGER, path)
    assert "colocation" not in json.loads(path.read_text()) and read_profile(path).colocation == {}


def test_profile_colocation_cli_then_tune(tmp_path):
    plan = bernoulli_source(tmp_path)
    first, second, out = tmp_path / "eager.json", tmp_path / "b3.json", tmp_path / "fitted.json"
    write_profile(EAGER, first)
    write_profile(B3, second)
    res = runner.invoke(app, ["profile", str(plan), "--colocation", str(first), "--colocation", str(second),
                              "-o", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (
        "slm: step +1.458 ms per unit of llm's busy share (measured at 0.69; changed by -0.350 ms at 0.45)"
        in res.output
    )
    assert "llm: busy 0.69 of the time" in res.output
    res = runner.invoke(app, ["tune", str(plan), "--profile", str(out), "-n", "8", "--json"])
    assert res.exit_code == 0, res.output
    tuning = json.loads(res.stdout)["tuning"]
    assert tuning["colocation"]["slm"]["co_runners"] == ["llm"]
    assert tuning["sources"]["colocation"]["slm"] == "profile (from the chain at B = (1, 1) and (1, 3))"
    assert not any("co-location" in w for w in tuning.get("warnings", []))  # (a timeout one may be there)
    assert all("step_shift_ms" in c for c in tuning["result"]["candidates"])
    # usage: two profiles, and not with --from-metrics
    res = runner.invoke(app, ["profile", str(plan), "--colocation", str(first)])
    assert res.exit_code == 2 and "--colocation takes two profiles" in res.output
    res = runner.invoke(app, ["profile", str(plan), "--colocation", str(first), "--colocation", str(second),
                              "--from-metrics", "m.txt"])  # fmt: skip
    assert res.exit_code == 2 and "without --from-metrics" in res.output
    res = runner.invoke(app, ["profile", str(plan), "--colocation", str(first), "--colocation", str(first)])
    assert res.exit_code == 1 and "about as busy in both profiles" in res.output
    res = runner.invoke(app, ["profile", str(plan), "--colocation", str(first), "--colocation", "nope.json"])
    assert res.exit_code == 1 and "nope.json" in res.output and "Traceback" not in res.output
