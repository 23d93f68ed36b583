"""`calibrate_threshold`: the threshold at which the entry model hands off on a wanted share of its own
generated positions, on the committed tiny random pair (an untrained r2r router; r_stitch's entropy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrouter.compiler.driver import compile_file
from tokenrouter.runtime.route.routers import init_router_file
from tokenrouter.training.calibrate import calibrate_threshold, resolution, resolution_warning
from tokenrouter.training.policy_view import PolicyViewError

REPO = Path(__file__).resolve().parents[2]
SMALL, LARGE = REPO / "examples/models/tiny-small", REPO / "examples/models/tiny-large"
PROMPTS = [[11 + 7 * i + j for j in range(6)] for i in range(4)]


def stdlib_plan(name: str, tmp_path: Path, **defines) -> dict:
    defines = {"slm_path": str(SMALL), "llm_path": str(LARGE), **defines}
    if name == "r2r":
        defines["router_path"] = str(tmp_path / "router.safetensors")
    defines = {k: str(v) for k, v in defines.items()}
    # the router files are written below
    res = compile_file(REPO / "tokenrouter/stdlib" / f"{name}.tr", defines, weights_check=False)
    assert res.plan is not None, [str(d) for d in res.diagnostics]
    for router, entry in res.plan["routers"].items():
        if not Path(entry["path"]).exists():
            init_router_file(res.plan, router, entry["path"], seed=0)
    return res.plan


@pytest.mark.parametrize("policy", ["r2r", "r_stitch"])
def test_calibrated_threshold_hands_off_at_the_wanted_share(policy, tmp_path):
    from tokenrouter.runtime import messages as m
    from tokenrouter.runtime.offline import load_offline

    plan = stdlib_plan(policy, tmp_path)
    found = {s: calibrate_threshold(plan, "threshold", s, PROMPTS, 20, "cpu") for s in (0.1, 0.3)}
    for share, got in found.items():
        assert got["positions"] == 4 * 20
        assert abs(got["share"] - share) <= 0.05, (share, got)
    # both policies hand off above the threshold: a larger share needs a lower one
    assert found[0.1]["threshold"] > found[0.3]["threshold"]
    # compiled with that threshold and served by the runtime, the plan hands off on the share reported
    got = found[0.3]
    again = stdlib_plan(policy, tmp_path, threshold=repr(got["threshold"]))
    runs = load_offline(again, "cpu").generate(
        PROMPTS, m.SamplingSpec(temperature=0.0, max_tokens=20, seed=0, ignore_eos=True)
    )
    writers = [w for r in runs for w in r.models]
    assert sum(w == "llm" for w in writers) / len(writers) == got["share"]


def test_calibration_steps_the_entry_model_with_its_device_current(tmp_path, monkeypatch):
    """With the models on two GPUs, the entry model's solo generations run with its GPU current (the
    models are loaded one after the other, so the current device is the last one's)."""
    from fake_devices import fake_devices

    seen = fake_devices(monkeypatch, "load_model_engine")
    got = calibrate_threshold(stdlib_plan("r_stitch", tmp_path), "threshold", 0.3, PROMPTS, 8)
    assert got["positions"] == 4 * 8
    assert ("fake-tiny-small", "fake-tiny-small") in seen
    assert [(dev, cur) for dev, cur in seen if cur and cur.startswith("fake-") and cur != dev] == []


def test_a_threshold_too_narrow_to_hold_is_flagged(tmp_path):
    """`resolution`: how far r_stitch's threshold moves between firing on 5 % and 15 % of the positions. The
    random-weight 0.6B gave entropies within ~1e-5 of each other (on the H200): such a threshold
    gets a warning; the tiny pair's spread does not."""
    import torch

    from tokenrouter.training.evaluate import compared_range
    from tokenrouter.training.policy_view import threshold_node

    plan = stdlib_plan("r_stitch", tmp_path)
    ir = plan["routes"][plan["entry"]]
    node = threshold_node(plan, ir, "threshold")
    gen = torch.Generator().manual_seed(0)
    for spread, narrow in ((1e-5, True), (0.2, False)):
        values = {"norm_entropy": 0.98 - spread * torch.rand(2000, generator=gen)}
        width = resolution(ir, values, 2000, node, 0.1, compared_range(ir, values, 2000, node))
        assert 0.05 * spread < width < 0.15 * spread, (spread, width)  # 10 % of uniform positions
        warning = resolution_warning("threshold", 0.1, 0.98, width)
        assert (warning is not None) == narrow and (not narrow or "threshold = 0.98" in warning)
    got = calibrate_threshold(plan, "threshold", 0.1, PROMPTS, 20, "cpu")
    assert got["solo_width"] > 1e-3 and "warning" not in got, got


def test_solo_generations_misjudge_the_served_share(tmp_path):
    """The reason calibration serves the plan: the entry model's solo positions, each rewrite not taken
    into account, put the threshold elsewhere (on this pair and these prompts, r2r hands off on less than
    the wanted share at the solo threshold)."""
    got = calibrate_threshold(stdlib_plan("r2r", tmp_path), "threshold", 0.3, PROMPTS, 20, "cpu")
    assert got["solo_threshold"] != got["threshold"] and abs(got["solo_share"] - 0.3) > 0.05, got


def test_calibration_errors_are_clear(tmp_path):
    plan = stdlib_plan("r2r", tmp_path)
    with pytest.raises(PolicyViewError, match="no param 'tau'"):
        calibrate_threshold(plan, "tau", 0.1, PROMPTS, 4, "cpu")
    with pytest.raises(ValueError, match=r"share must be in \(0, 1\)"):
        calibrate_threshold(plan, "threshold", 1.0, PROMPTS, 4, "cpu")


def test_calibrate_command(tmp_path):
    import json

    from typer.testing import CliRunner

    from tokenrouter.cli import app

    runner = CliRunner()
    tr = str(REPO / "tokenrouter/stdlib/r_stitch.tr")
    models = ["-D", f"slm_path={SMALL}", "-D", f"llm_path={LARGE}", "--device", "cpu"]
    small = ["--num-prompts", "3", "--max-tokens", "12", "--iterations", "6"]
    res = runner.invoke(app, ["calibrate", tr, "--share", "0.25", "--json", *models, *small])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert abs(got["share"] - 0.25) <= 0.1 and got["positions"] == 3 * 12
    res = runner.invoke(app, ["calibrate", tr, "--share", "0.25", *models, *small])
    assert res.exit_code == 0 and "threshold = " in res.stdout and "wanted 0.25" in res.stdout
    res = runner.invoke(app, ["calibrate", tr, "--share", "1.5", *models])
    assert res.exit_code == 2 and "--share must be in (0, 1)" in res.output
    res = runner.invoke(app, ["calibrate", tr, "--share", "0.2", "--param", "tau", *models])
    assert res.exit_code == 1 and "no param 'tau'" in res.output and "Traceback" not in res.output
    res = runner.invoke(
        app, ["calibrate", tr, "--share", "0.2", "-D", "slm_path=/nowhere", "-D", f"llm_path={LARGE}"]
    )
    assert res.exit_code == 1 and "/nowhere" in res.output and "Traceback" not in res.output


def test_calibration_sets_the_threads_serve_gives_and_shows_progress(tmp_path, monkeypatch, capsys):
    from tokenrouter import progress
    from tokenrouter.runtime import threads

    asked = []
    monkeypatch.setattr(threads, "set_torch_threads", asked.append)
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    plan = stdlib_plan("r_stitch", tmp_path)
    got = calibrate_threshold(plan, "threshold", 0.25, PROMPTS, 6, "cpu", iterations=3)
    assert asked == [2]  # two models in one process: the threads each of serve's two subservers gets
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("calibrate: 0 routed generations (the entry model alone: 24 positions), ")
    assert err[1].startswith("calibrate: 1 routed generations (threshold ")
    assert (
        err[-1].startswith(f"calibrate: {len(err) - 2} routed generations (done), ")
        and got["positions"] == 24
    )
