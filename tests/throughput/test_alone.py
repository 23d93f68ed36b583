"""Contention by state: a model sharing a GPU takes its latency alone (`AloneLatency`) for the steps it starts
while no co-runner is running, and the latency measured beside them otherwise; the chain, its vectorized
builder and the simulator all pick per step, and `profile --alone` / `tune` carry it from the files."""

from __future__ import annotations

import dataclasses
import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.compiler.plan import read_plan
from tokenrouter.throughput.dtmc import analyze, with_transit
from tokenrouter.throughput.inputs import (
    AloneLatency,
    ColocationTerm,
    StepLatency,
    SystemInputs,
    make_inputs,
    with_step_ms,
)
from tokenrouter.throughput.optimize import tune
from tokenrouter.throughput.plan_inputs import system_from_plan
from tokenrouter.throughput.profile_format import ProfileError, read_profile, write_profile
from tokenrouter.throughput.simulate import SimConfig, simulate

from .test_dtmc import assert_same_chain

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "tests" / "fixtures" / "runs"  # the served runs' archives, cut to the files these tests read
runner = CliRunner()


def with_alone(inp: SystemInputs, alone: dict[str, dict[int, float]]) -> SystemInputs:
    lone = tuple(
        None
        if m not in alone
        else AloneLatency(
            tuple(j for j in range(inp.n_models) if j != i), StepLatency(tuple(alone[m].items()))
        )
        for i, m in enumerate(inp.models)
    )
    return SystemInputs(inp.models, inp.step, inp.p, inp.c, inp.concurrency, inp.entry, alone=lone)


def ping_pong(n: int) -> SystemInputs:
    """Every step hops: slm -> llm -> slm; beside each other slm takes 3 ms and llm 10."""
    return make_inputs(["slm", "llm"], {"slm": 3.0, "llm": 10.0}, [[0, 1], [1, 0]], [[1, 1], [1, 1]], n)


def test_one_request_always_steps_alone():
    """N = 1: one model runs at a time, so every step takes the latency alone: 2 tokens per 1 + 4 ms."""
    inp = with_alone(ping_pong(1), {"slm": {1: 1.0}, "llm": {1: 4.0}})
    res = analyze(inp, (1, 1), delta_ms=0.1)
    assert res.throughput == pytest.approx(2 / 5.0 * 1000)
    assert analyze(ping_pong(1), (1, 1), delta_ms=0.1).throughput == pytest.approx(2 / 13.0 * 1000)
    sim = simulate(inp, SimConfig((1, 1), horizon_ms=5000, warmup_ms=100))
    assert sim.throughput == pytest.approx(400.0, rel=0.01)


def test_a_step_gap_lengthens_the_latency_alone_too():
    """`with_step_ms` (a host gap per step, `tune --gap-ms`) adds to a model's steps alone and beside: at N = 1, two
    tokens per (1 + 0.5) + (4 + 1.5) ms; the wrong count of additions is refused."""
    inp = with_alone(ping_pong(1), {"slm": {1: 1.0}, "llm": {1: 4.0}})
    gapped = with_step_ms(inp, (0.5, 1.5))
    assert analyze(gapped, (1, 1), delta_ms=0.1).throughput == pytest.approx(2 / 7.0 * 1000)
    assert gapped.step[0].at(1) == 3.5 and gapped.alone[1].step.at(1) == 5.5
    assert with_step_ms(ping_pong(1), (0.5, 1.5)).alone == ()
    with pytest.raises(ValueError, match="expected 2 step additions"):
        with_step_ms(inp, (0.5,))


def test_a_hops_transit_as_a_delay_per_token():
    """`with_transit`: one request hopping slm -> llm -> slm, steps of 3 and 10 ms, hops of 1 ms into slm and 2 into
    llm: 2 tokens per 16 ms, which the simulator serves too; no delay leaves T as it was."""
    inp = ping_pong(1)
    res = analyze(inp, (1, 1), delta_ms=0.1)
    assert res.throughput == pytest.approx(2 / 13.0 * 1000)
    assert with_transit(inp, res, (1.0, 2.0)) == pytest.approx(2 / 16.0 * 1000)
    assert with_transit(inp, res, (0.0, 0.0)) == pytest.approx(res.throughput)
    sim = simulate(inp, SimConfig((1, 1), hop_ms=(1.0, 2.0), horizon_ms=5000, warmup_ms=100))
    assert sim.throughput == pytest.approx(125.0, rel=0.01)


def test_latencies_alone_equal_to_the_shared_ones_change_nothing():
    base = make_inputs(["a", "b"], {"a": StepLatency(((1, 2.0), (4, 3.0))), "b": StepLatency(((1, 7.0), (4, 8.0)))},
                       [[0.7, 0.3], [0.9, 0.1]], [[1, 1], [1, 1]], 4)  # fmt: skip
    same = with_alone(base, {"a": {1: 2.0, 4: 3.0}, "b": {1: 7.0, 4: 8.0}})
    for b in ((1, 1), (1, 3), (2, 2)):
        assert analyze(same, b).throughput == pytest.approx(analyze(base, b).throughput, rel=1e-12)


@pytest.mark.parametrize("thresholds", [(1, 1), (1, 3), (2, 2)])
def test_vectorized_chain_equals_reference_with_latencies_alone(thresholds):
    inp = with_alone(
        make_inputs(
            ["a", "b", "c"],
            {"a": 3.0, "b": 5.0, "c": 11.0},
            [[0.8, 0.15, 0.05], [0.7, 0.3, 0], [1, 0, 0]],
            [[1, 1, 0], [1, 1, 0], [1, 0, 0]],
            5,
        ),  # fmt: skip
        {"a": {1: 1.5, 5: 2.0}, "c": {1: 6.0}},
    )
    assert_same_chain(inp, (1, *thresholds), 1.0)
    # and some steps did take the latency alone: the chain differs from the one without
    assert (
        analyze(inp, (1, *thresholds)).throughput
        > analyze(SystemInputs(inp.models, inp.step, inp.p, inp.c, 5), (1, *thresholds)).throughput
    )


def test_the_simulator_agrees_with_the_chain():
    inp = with_alone(
        make_inputs(
            ["slm", "llm"],
            {"slm": StepLatency(((1, 2.0), (3, 2.6), (7, 3.0))), "llm": 7.0},
            [[0.64, 0.36], [1.0, 0.0]],
            [[1, 1], [1, 1]],
            8,
        ),  # fmt: skip
        {"slm": {1: 1.5, 8: 1.6}},
    )
    for b in ((1, 1), (1, 5)):
        sim = simulate(inp, SimConfig(b, horizon_ms=60000, seed=1))
        assert sim.throughput == pytest.approx(analyze(inp, b).throughput, rel=0.02)


def test_inputs_are_checked():
    inp = ping_pong(2)
    lone = AloneLatency((1,), StepLatency.constant(1.0))
    with pytest.raises(ValueError, match="expected 2 latencies alone"):
        SystemInputs(inp.models, inp.step, inp.p, inp.c, 2, alone=(lone,))
    with pytest.raises(ValueError, match="other models' indices"):
        SystemInputs(inp.models, inp.step, inp.p, inp.c, 2, alone=(AloneLatency((0,), lone.step), None))
    with pytest.raises(ValueError, match="at least one co-runner"):
        AloneLatency((), lone.step)
    with pytest.raises(ValueError, match="not both"):
        SystemInputs(inp.models, inp.step, inp.p, inp.c, 2, colocation=(ColocationTerm((1,), 1.0, 0.5), None),
                     alone=(lone, None))  # fmt: skip


RUN55 = RUNS / "run55.tar.gz"
# the 0.6B's latencies in a served (1, 5) at run55.tar.gz's load (H200) at 4-8 rows, when the 8B, holding 4 or
# fewer, waits to gather five; below 4 rows the 4-row figure (not observed alone there)
ALONE_SLM = {1: 1.52, 4: 1.52, 5: 1.58, 6: 1.59, 7: 1.64, 8: 1.62}
# served beside eager at that load in four runs at 20 ms, mean tok/s
SERVED = {1: 1423.6, 3: 1535.5, 4: 1626.6, 5: 1691.9, 6: 1705.0, 8: 1388.1}


@pytest.fixture(scope="module")
def run55(tmp_path_factory):
    out = tmp_path_factory.mktemp("run55")
    with tarfile.open(RUN55) as tar:
        tar.extractall(out, filter="data")
    return next(out.glob("raw-*"))


def test_the_h200_runs_rank_as_served(run55, tmp_path):
    """On run55.tar.gz's eager profile, the plain chain puts B_llm = 3 first and (1, 5) below (1, 1)'s neighbours,
    where (1, 5)-(1, 6) served best; with the 0.6B's latencies alone it ranks B_llm = 1-6 as served, at
    0.85-0.90x of each (B_llm = 8, where all the requests wait at the 8B, is over-predicted: 0.82x)."""
    plan = read_plan(run55 / "0.6b+8b-bern0.35.plan")
    eager = read_profile(run55 / "profile-n8.json")
    alone = {"slm": StepLatency(tuple(ALONE_SLM.items()))}
    path = tmp_path / "p.json"
    write_profile(dataclasses.replace(eager, alone_ms=alone), path)
    state = system_from_plan(plan, 8, profile=read_profile(path))
    plain = system_from_plan(plan, 8, profile=eager)
    assert state.sources["alone"] == {"slm": "profile"} and state.warnings == []
    got = {b: analyze(state.inputs, (1, b)).throughput for b in range(1, 9)}
    old = {b: analyze(plain.inputs, (1, b)).throughput for b in range(1, 9)}
    assert max(old, key=old.get) == 3 and old[5] < old[1]
    assert max(got, key=got.get) in (5, 6, 7)
    order = [b for b in sorted(SERVED, key=SERVED.get) if b != 8]
    assert sorted(order, key=got.get) == order
    for b in order:
        assert 0.84 < SERVED[b] / got[b] < 0.91
    assert SERVED[8] / got[8] < 0.84


def test_profile_alone_cli_then_tune(run55, tmp_path):
    plan = run55 / "0.6b+8b-bern0.35.plan"
    lone = tmp_path / "alone.json"
    eager = read_profile(run55 / "profile-n8.json")
    eager.step_ms["slm"] = StepLatency(
        tuple(ALONE_SLM.items())
    )  # as `tokenrouter profile PLAN` would time it
    write_profile(eager, lone)
    after, before = run55 / "profile-metrics-n8-after.txt", run55 / "profile-metrics-n8-before.txt"
    out = tmp_path / "state.json"
    res = runner.invoke(app, ["profile", str(plan), "--from-metrics", str(after), "--since", str(before),
                              "--alone", str(lone), "-o", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "slm: alone b=1 1.520 ms, b=4 1.520 ms" in res.output
    prof = read_profile(out)
    assert set(prof.alone_ms) == {"slm", "llm"} and prof.workload["alone_source"] == str(lone)
    assert json.loads(out.read_text())["alone_ms"]["slm"]["5"] == 1.58
    res = runner.invoke(app, ["tune", str(plan), "--profile", str(out), "-n", "8", "--json", "-o",
                              str(tmp_path / "t.plan")])  # fmt: skip
    assert res.exit_code == 0, res.output
    tuning = json.loads(res.stdout)["tuning"]
    assert tuning["result"]["best"]["llm"] in (5, 6, 7)
    assert tuning["alone"]["slm"]["co_runners"] == ["llm"]
    assert tuning["sources"]["alone"] == {"slm": "profile", "llm": "profile"}
    # usage and input errors: a message, not a traceback
    res = runner.invoke(app, ["profile", str(plan), "--alone", str(lone)])
    assert res.exit_code == 2 and "--alone goes with --from-metrics" in res.output
    res = runner.invoke(app, ["profile", str(plan), "--from-metrics", str(after), "--alone", "nope.json"])
    assert res.exit_code == 1 and "nope.json" in res.output and "Traceback" not in res.output
    apart = json.loads(plan.read_text())
    apart["models"]["llm"]["gpus"] = [1]
    (tmp_path / "apart.plan").write_text(json.dumps(apart))
    res = runner.invoke(app, ["profile", str(tmp_path / "apart.plan"), "--from-metrics", str(after),
                              "--alone", str(lone)])  # fmt: skip
    assert res.exit_code == 1 and "no two models of the plan share a GPU" in res.output
    # a profile with latencies alone, tuned for a plan whose models do not share a GPU: left out, said so
    res = runner.invoke(app, ["tune", str(tmp_path / "apart.plan"), "--profile", str(out), "-n", "8", "--json",
                              "-o", str(tmp_path / "t2.plan")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "latencies alone of slm are left out: no model shares its GPU" in res.stderr
    # given latencies replace the profile's, and its latencies alone with them
    res = runner.invoke(app, ["tune", str(plan), "--profile", str(out), "-n", "8", "--json", "--step-ms",
                              "slm=2.0", "-o", str(tmp_path / "t3.plan")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "latencies alone of slm are left out: its step latencies come from --step-ms" in res.stderr


def test_profile_merge_cli_takes_the_other_profiles_latencies_where_it_has_them(run55, tmp_path):
    """`profile --from-metrics ... --merge OTHER`: OTHER's latencies (every step, alone and beside) replace the
    eager profile's at the batch sizes OTHER measured; the eager profile's stay at the rest, and its routing."""
    from tokenrouter.throughput.commands.profile_merge import merge_served
    from tokenrouter.throughput.plan_inputs import ThroughputInputError

    plan = run55 / "0.6b+8b-bern0.35.plan"
    after, before = run55 / "profile-metrics-n8-after.txt", run55 / "profile-metrics-n8-before.txt"
    eager = tmp_path / "eager.json"
    res = runner.invoke(app, ["profile", str(plan), "--from-metrics", str(after), "--since", str(before),
                              "-o", str(eager)])  # fmt: skip
    assert res.exit_code == 0, res.output
    base = read_profile(eager)
    other = dataclasses.replace(
        base,
        step_ms={"slm": StepLatency(((5, 1.4), (9, 1.9)))},
        alone_ms={"slm": StepLatency(((5, 1.3), (9, 1.8)))},
        beside_ms={"slm": StepLatency(((9, 2.9),))},
        routing={"slm": {"slm": 0.5, "llm": 0.5}, "llm": {"slm": 1.0}},
    )
    write_profile(other, tmp_path / "other.json")
    out = tmp_path / "merged.json"
    res = runner.invoke(app, ["profile", str(plan), "--from-metrics", str(after), "--since", str(before),
                              "--merge", str(tmp_path / "other.json"), "-o", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert f"slm: latencies at batch sizes 5,9 from {tmp_path / 'other.json'}" in res.output
    got = read_profile(out)
    assert got.routing == base.routing and got.step_ms["llm"] == base.step_ms["llm"]
    want = {**dict(base.step_ms["slm"].points), 5: 1.4, 9: 1.9}
    assert dict(got.step_ms["slm"].points) == want
    assert not base.alone_ms and not base.beside_ms  # run55.tar.gz's servers had no busy board: OTHER's alone
    assert dict(got.alone_ms["slm"].points) == {5: 1.3, 9: 1.8} and dict(got.beside_ms["slm"].points) == {
        9: 2.9
    }
    again = merge_served(got, dataclasses.replace(other, alone_ms={"slm": StepLatency(((4, 1.1),))}), "x")
    assert dict(again.alone_ms["slm"].points) == {4: 1.1, 5: 1.3, 9: 1.8}
    assert got.workload["merged_from"] == str(tmp_path / "other.json")
    assert merge_served(base, base, "same").step_ms == base.step_ms  # merged with itself: unchanged
    stranger = dataclasses.replace(
        other, step_ms={"big": StepLatency(((1, 9.0),))}, alone_ms={}, beside_ms={}
    )
    with pytest.raises(ThroughputInputError, match="x.json: no step latencies for slm, llm"):
        merge_served(base, stranger, "x.json")
    only = merge_served(
        base, dataclasses.replace(other, step_ms={**other.step_ms, "big": StepLatency(((1, 9.0),))}), "y"
    )
    assert set(only.step_ms) == set(base.step_ms)  # a model this profile lacks is left out
    res = runner.invoke(app, ["tune", str(plan), "--profile", str(out), "-n", "8", "--json", "-o",
                              str(tmp_path / "t.plan")])  # fmt: skip
    assert res.exit_code == 0, res.output
    # usage and input errors: a message, not a traceback
    res = runner.invoke(app, ["profile", str(plan), "--merge", str(out)])
    assert res.exit_code == 2 and "--merge goes with --from-metrics" in res.output
    res = runner.invoke(app, ["profile", str(plan), "--from-metrics", str(after), "--merge", str(out),
                              "--alone", str(out)])  # fmt: skip
    assert res.exit_code == 2 and "give --alone or --merge, not both" in res.output
    res = runner.invoke(app, ["profile", str(plan), "--from-metrics", str(after), "--merge", "nope.json"])
    assert res.exit_code == 1 and "nope.json" in res.output and "Traceback" not in res.output


def test_profile_files_keep_and_check_the_latencies_alone(tmp_path, run55):
    eager = read_profile(run55 / "profile-n8.json")
    path = tmp_path / "p.json"
    eager.alone_ms = {"slm": StepLatency(((1, 1.5),))}
    write_profile(eager, path)
    assert read_profile(path).alone_ms["slm"].points == ((1, 1.5),)
    data = json.loads(path.read_text())
    for bad, msg in (({"slm": {"1": -1}}, "alone_ms.slm"), ({"slm": {}}, "alone_ms.slm"),
                     ({"big": {"1": 1.0}}, "a model without step_ms")):  # fmt: skip
        path.write_text(json.dumps({**data, "alone_ms": bad}))
        with pytest.raises(ProfileError, match=msg):
            read_profile(path)
    term = {"slm": {"co_runners": ["llm"], "ms_per_share": 1.0, "at_share": 0.5}}
    path.write_text(json.dumps({**data, "colocation": term}))
    with pytest.raises(ProfileError, match="not both"):
        read_profile(path)


def test_the_latency_beside_comes_from_beside_ms_where_measured(run55):
    """A profile from a server with a busy board holds `beside_ms` too: the chain takes it for the steps
    started beside a running co-runner, and `step_ms` (every step) for a model without it."""
    plan = read_plan(run55 / "0.6b+8b-bern0.35.plan")
    eager = read_profile(run55 / "profile-n8.json")
    beside = StepLatency(((1, 2.4), (7, 3.1)))
    prof = dataclasses.replace(eager, alone_ms={"slm": StepLatency(((1, 1.5),))}, beside_ms={"slm": beside})
    inputs = system_from_plan(plan, 8, profile=prof).inputs
    assert inputs.step[0] == beside and inputs.step[1] == eager.step_ms["llm"]
    assert inputs.alone[0].step.points == ((1, 1.5),) and inputs.alone[1] is None


RUN61 = RUNS / "run61.tar.gz"
# the 0.6B's latencies in a served (2, 5) at run61.tar.gz's load (H200) at 4-8 rows, where the 8B, holding 4 or
# fewer, waits: the steps the busy board's counters count alone (no 8B step overlapping them); flat below 4 rows
ALONE_SLM_COUNTERS = {4: 1.47, 5: 1.57, 6: 1.58, 7: 1.62, 8: 1.58}
# served in run61.tar.gz beside its eager row, tok/s
SERVED_61 = {(1, 1): 1484.3, (2, 3): 1661.8, (2, 4): 1754.2, (2, 5): 1764.3, (2, 6): 1759.1}


def test_tuned_on_a_served_runs_first_latencies_alone_and_on_the_counters(tmp_path):
    """run61.tar.gz's eager profile carries the first busy board's latencies alone (a step alone when no 8B step was
    running at its start): those steps took as long as the others, and `tune` chose (2, 3), served at 1.12x
    eager. With the 0.6B's latencies alone as the step counters count them (no 8B step overlapping), it
    chooses B_slm = 2 with B_llm = 4-6, which served 1.18-1.19x eager, and predicts every row served at
    0.85-0.95x."""
    with tarfile.open(RUN61) as tar:
        tar.extractall(tmp_path, filter="data")
    raw = next(tmp_path.glob("raw-*"))
    plan = read_plan(raw / "0.6b+8b-bern0.35.plan")
    eager = read_profile(raw / "profile-n8.json")
    assert abs(eager.alone_ms["slm"].at(1) - eager.beside_ms["slm"].at(1)) < 0.2  # 1.77 against 1.95 ms
    first = system_from_plan(plan, 8, profile=eager)
    assert tune(first.inputs).best.thresholds == (2, 3)
    counted = dataclasses.replace(eager, alone_ms={"slm": StepLatency(tuple(ALONE_SLM_COUNTERS.items()))})
    inputs = system_from_plan(plan, 8, profile=counted).inputs
    best = tune(inputs).best.thresholds
    assert best[0] == 2 and 4 <= best[1] <= 6
    for b, served in SERVED_61.items():
        assert 0.85 < served / analyze(inputs, b).throughput < 0.95


def test_merged_latencies_alone_are_fitted_again_where_the_two_profiles_meet(tmp_path):
    """Each profile's latencies alone are fitted non-decreasing on their own; merged, one profile's batch sizes
    can meet the other's lower. run91.tar.gz's eager profile (H200) has the 0.6B alone at 4 rows at
    1.433 ms from 20 steps; a second profile with 3 rows at 1.6 ms from 200 steps pools the two, each weighted
    by its steps, and the profile records the pooled sizes. Profiles made before the fit are merged as before."""
    from tokenrouter.throughput.commands.profile_merge import merge_served

    archive = RUNS / "run91.tar.gz"
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/profile-n8.json"))
        (tmp_path / "eager.json").write_bytes(tar.extractfile(member).read())
    base = read_profile(tmp_path / "eager.json")
    assert base.workload["alone_fit"] == "non-decreasing"
    assert base.workload["steps_by_state"]["slm"]["alone"]["4"] == 20
    four = dict(base.alone_ms["slm"].points)[4]
    other = dataclasses.replace(
        base,
        step_ms={"slm": StepLatency(((3, 2.0),))},
        alone_ms={"slm": StepLatency(((3, 1.6),))},
        beside_ms={"slm": StepLatency(((3, 2.1),))},
        workload={"steps_by_state": {"slm": {"alone": {"3": 200}, "beside": {"3": 50}}}},
    )
    got = merge_served(base, other, "second.json")
    pooled = (1.6 * 200 + four * 20) / 220
    assert dict(got.alone_ms["slm"].points)[3] == pytest.approx(pooled)
    assert dict(got.alone_ms["slm"].points)[4] == pytest.approx(pooled)
    assert got.workload["merged_alone_pooled"] == {"slm": [[3, 4]]}
    from tokenrouter.throughput.commands.profile_describe import write_and_describe

    text = write_and_describe(got, str(ROOT / "examples" / "bernoulli.tr"), str(tmp_path / "merged.json"))
    assert "slm: merged, alone at batch sizes 3-4 pooled into one mean" in text
    assert set(got.alone_ms) == set(base.alone_ms) and got.step_ms["llm"] == base.step_ms["llm"]
    unfitted = dataclasses.replace(
        base, workload={k: v for k, v in base.workload.items() if k != "alone_fit"}
    )
    plain = merge_served(unfitted, other, "second.json")
    assert dict(plain.alone_ms["slm"].points)[3] == 1.6 and "merged_alone_pooled" not in plain.workload


RUN141 = RUNS / "run141.tar.gz"
RUN135 = RUNS / "run135.tar.gz"


@pytest.mark.parametrize(("run", "too_few"), [(RUN141, {"slm": 16, "llm": 1}), (RUN135, None)])
def test_tune_warns_where_the_steps_alone_are_too_few_for_contention_by_state(run, too_few, tmp_path):
    """run141.tar.gz's 4-round eager profile had the 0.6B alone in 16 steps, under the 20 that a latency alone
    needs, so `tune` fell back to the plain chain without a word and chose (1, 3), 12 % below the (2, 6) beside
    it; now the profile records the counts and `tune` says so. run135.tar.gz's 8-round profile tuned by state:
    no warning."""
    with tarfile.open(run) as tar:
        tar.extractall(tmp_path, filter="data")
    raw = next(tmp_path.glob("raw-*"))
    plan = raw / "0.6b+8b-bern0.35.plan"
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["profile", str(plan), "--from-metrics", str(raw / "profile-metrics-n8-after.txt"),
                              "--since", str(raw / "profile-metrics-n8-before.txt"), "--min-steps", "20",
                              "-o", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert read_profile(out).workload.get("alone_too_few") == too_few
    said = "slm: 16 steps alone, too few for latencies alone (min_steps 20): tune prices every step beside"
    assert (said in res.output) == bool(too_few)
    res = runner.invoke(app, ["tune", str(plan), "--profile", str(out), "-n", "8", "--json", "-o",
                              str(tmp_path / "t.plan")])  # fmt: skip
    assert res.exit_code == 0, res.output
    tuning = json.loads(res.stdout)["tuning"]
    warned = [w for w in tuning.get("warnings", []) if "steps alone are too few" in w]
    if too_few:
        assert warned == [
            "the profile's steps alone are too few for contention by state (slm 16, llm 1; a model needs 20): "
            "the chain prices every step at its mean beside the other model, which under-rates thresholds that "
            "leave the small model stepping alone; profile a longer load (more requests)"
        ]
        assert "steps alone are too few" in res.stderr and not tuning.get("alone")
        assert tuning["result"]["best"] == {"slm": 1, "llm": 3}  # what run141.tar.gz served, 1.079x eager
    else:
        assert not warned and tuning["alone"]


def test_a_merge_that_brings_latencies_alone_drops_the_too_few_note(tmp_path):
    """run141.tar.gz's thin profile merged with run135.tar.gz's (which has latencies alone): the merged profile
    tunes by state, so neither it nor `tune` speaks of too few steps alone."""
    raws = {}
    for name, run in (("r141", RUN141), ("r135", RUN135)):
        with tarfile.open(run) as tar:
            tar.extractall(tmp_path / name, filter="data")
        raws[name] = next((tmp_path / name).glob("raw-*"))

    def profile(raw, out, *extra):
        res = runner.invoke(app, ["profile", str(raw / "0.6b+8b-bern0.35.plan"), "--from-metrics",
                                  str(raw / "profile-metrics-n8-after.txt"), "--since",
                                  str(raw / "profile-metrics-n8-before.txt"), "--min-steps", "20", "-o", str(out),
                                  *extra])  # fmt: skip
        assert res.exit_code == 0, res.output
        return res

    profile(raws["r135"], tmp_path / "p135.json")
    res = profile(raws["r141"], tmp_path / "merged.json", "--merge", str(tmp_path / "p135.json"))
    merged = read_profile(tmp_path / "merged.json")
    assert merged.alone_ms and "alone_too_few" not in merged.workload and "too few" not in res.output
    res = runner.invoke(app, ["tune", str(raws["r141"] / "0.6b+8b-bern0.35.plan"), "--profile",
                              str(tmp_path / "merged.json"), "-n", "8", "--json", "-o", str(tmp_path / "t.plan")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "too few" not in res.stderr and json.loads(res.stdout)["tuning"]["alone"]
