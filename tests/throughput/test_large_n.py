"""The sampled chain (`large_n.py`): where both run, it agrees with the exhaustive chain; `tune` takes it where the
chains are too many or too large, and says so in its record."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.compiler.plan import read_plan
from tokenrouter.throughput import large_n
from tokenrouter.throughput.dtmc import analyze
from tokenrouter.throughput.inputs import (
    AloneLatency,
    PrefillCost,
    StepLatency,
    SystemInputs,
    make_inputs,
)
from tokenrouter.throughput.large_n import ladder, sampled_analyze, tune_sampled
from tokenrouter.throughput.optimize import tune

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
SLM = StepLatency(((1, 2.0), (8, 2.2), (32, 2.6), (64, 3.2), (128, 4.5)))
LLM = StepLatency(((1, 5.0), (8, 5.2), (32, 6.0), (64, 7.0), (128, 9.2)))
STEP_MS = ["--step-ms", "slm=1:2,8:2.2,32:2.6,64:3.2,128:4.5", "--step-ms", "llm=1:5,8:5.2,32:6,64:7,128:9.2"]


def two(n: int, p: float = 0.2, back: float = 1.0, slm=SLM, llm=LLM, drop: bool = False) -> SystemInputs:
    c = [[1, 0 if drop else 1], [1, 1]]
    return make_inputs(["slm", "llm"], {"slm": slm, "llm": llm}, [[1 - p, p], [back, 1 - back]], c, n)


def three(n: int) -> SystemInputs:
    return make_inputs(["a", "b", "c"], {"a": 3.0, "b": 5.0, "c": 11.0},
                       [[0.8, 0.15, 0.05], [0.7, 0.3, 0], [1, 0, 0]], [[1, 1, 0], [1, 1, 0], [1, 0, 0]], n)  # fmt: skip


# (inputs, δ ms): small N, where the exhaustive chain runs too
SETTINGS = [
    (two(6), 0.1),
    (two(8, p=0.35, drop=True, slm=StepLatency.constant(6.0), llm=StepLatency.constant(27.9)), 0.1),
    (two(10, p=0.1, back=0.5), 0.1),
    (two(12, p=0.2, slm=StepLatency(((1, 1.7), (12, 2.4))), llm=StepLatency(((1, 6.6), (12, 9.0)))), 0.2),
    (three(5), 1.0),
    (three(7), 1.0),
]


@pytest.mark.parametrize(("inputs", "delta_ms"), SETTINGS)
def test_the_sampled_choice_agrees_with_the_exhaustive_chain(inputs, delta_ms, monkeypatch):
    """The sampled search's B*, evaluated by the exact chain, is within 3 % of the chain's best, and its predicted
    T is within 2 % of the chain's T at that B."""
    monkeypatch.setattr(large_n, "EXACT_WORK", 10**9)  # the exact search, however long
    exact = tune(inputs, delta_ms=delta_ms)
    assert exact.method == "exhaustive"
    chain = {r.thresholds: r.throughput for r in exact.results}
    sampled = tune_sampled(inputs, {}, delta_ms)
    assert sampled.method == "sampled"
    b = sampled.best.thresholds
    assert chain[b] >= 0.97 * exact.best.throughput
    assert sampled.best.throughput == pytest.approx(chain[b], rel=0.02)
    assert sampled.best.stderr_tok_s < 0.015 * sampled.best.throughput


def test_a_sampled_path_reports_what_the_chain_does():
    """Utilization, batch, queue and steps per second of one path are the chain's, and so are a latency alone
    (by state) and a prefill cost (at the fixed point)."""
    base = two(8)
    lone = AloneLatency((0,), StepLatency.constant(3.5))
    for inputs in (
        base,
        SystemInputs(base.models, base.step, base.p, base.c, 8, alone=(None, lone)),
        SystemInputs(
            base.models, base.step, base.p, base.c, 8, prefill=(PrefillCost(0.05), PrefillCost(0.1))
        ),
    ):
        exact, sampled = analyze(inputs, (2, 3)), sampled_analyze(inputs, (2, 3), 0.1)
        assert sampled.throughput == pytest.approx(exact.throughput, rel=0.02)
        assert sampled.utilization == pytest.approx(exact.utilization, abs=0.02)
        assert sampled.mean_batch == pytest.approx(exact.mean_batch, rel=0.03)
        assert sampled.steps_per_s == pytest.approx(exact.steps_per_s, rel=0.03)
        assert sampled.mean_queue == pytest.approx(exact.mean_queue, abs=0.1)
        assert sampled.prefill_ms == pytest.approx(exact.prefill_ms, rel=0.02)


def test_tune_samples_where_the_candidates_are_many():
    """Three models at N = 32, one fixed: 496 candidates; every one raced is feasible, the fixed one held."""
    inputs = three(32)
    result = tune(inputs, fixed={"b": 2})
    assert result.method == "sampled" and result.n_feasible == 496
    assert all(r.thresholds[1] == 2 and sum(x - 1 for x in r.thresholds) < 32 for r in result.results)
    record = result.as_dict(top=3)
    assert record["method"] == "sampled" and record["sampling"]["finalists"] == 4
    assert record["candidates"][0]["sampled_epochs"] > 0 and "stderr_tok_s" in record["candidates"][0]
    from tokenrouter.throughput.commands.tune import format_table

    # the finalists' rows first, then the race's, marked (their figures are not the finalists' kind)
    rows = format_table(result, top=6).splitlines()
    assert [r.split()[4] for r in rows[1:7]] == ["sampled"] * 4 + ["race"] * 2
    assert rows[-1].startswith("race: ")
    assert "race" not in format_table(result, top=4)


def test_tune_samples_a_chain_too_large_to_solve(monkeypatch):
    """One candidate whose chain is over the exact limit (lowered here): sampled, not refused."""
    inputs = two(10)
    assert tune(inputs, fixed={"slm": 2, "llm": 1}).method == "exhaustive"
    monkeypatch.setattr(large_n, "EXACT_STATES", 50)
    result = tune(inputs, fixed={"slm": 2, "llm": 1})
    assert result.method == "sampled" and result.best.thresholds == (2, 1)
    assert result.best.throughput == pytest.approx(analyze(inputs, (2, 1)).throughput, rel=0.02)


def test_tune_samples_where_the_exact_search_would_be_long(monkeypatch):
    """The probe chain's states times the candidates over `EXACT_WORK`: sampled, though every chain would fit."""
    inputs = two(8)
    assert tune(inputs).method == "exhaustive"
    monkeypatch.setattr(
        large_n, "EXACT_WORK", 36 * 50
    )  # 36 candidates; the probe chain has more than 50 states
    assert tune(inputs).method == "sampled"


def test_the_ladder_and_a_zoom_reach_every_integer():
    assert ladder(128) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
    axis = ladder(128)
    for _ in range(10):
        nxt = large_n._zoom(axis, 64, 11)
        if nxt == axis:
            break
        axis = nxt
    assert axis == list(range(axis[0], axis[-1] + 1)) and 64 in axis


def test_tune_cli_at_n_128_names_the_method(tmp_path):
    """`tune` at N = 128 with two auto models (the chain had more than 250,000 states and tune failed after
    40 s): the sampled method, named in `--json` and by `inspect`."""
    out = tmp_path / "b.plan"
    src = str(ROOT / "tokenrouter" / "stdlib" / "bernoulli.tr")
    res = runner.invoke(app, ["tune", src, "-n", "128", *STEP_MS, "-o", str(out), "--json", "--top", "3"])
    assert res.exit_code == 0, res.output
    tuning = json.loads(res.stdout)["tuning"]
    assert tuning["result"]["method"] == "sampled"
    best = tuning["result"]["best"]
    assert best["slm"] + best["llm"] - 2 < 128
    assert read_plan(out)["models"]["llm"]["batch"] == best["llm"]
    shown = runner.invoke(app, ["inspect", str(out)])
    assert shown.exit_code == 0 and "sampled" in shown.output
    text = runner.invoke(app, ["tune", src, "-n", "128", *STEP_MS, "-o", str(out)])
    assert text.exit_code == 0 and "sampled chain" in text.output and "±" in text.output
