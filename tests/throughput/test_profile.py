import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.throughput.profile_format import ProfileError, read_profile

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_profile_then_tune_reads_it(tmp_path):
    if not (EXAMPLES / "models" / "py-small" / "model.safetensors").is_file():
        pytest.skip("demo example models absent")
    out = tmp_path / "b.profile.json"
    args = ["profile", str(EXAMPLES / "bernoulli.tr"), "-o", str(out), "--batch-sizes", "1,2", "--prompts", "4",
            "--max-tokens", "8", "--repeats", "1", "--warmup", "0", "--device", "cpu"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    prof = read_profile(out)
    assert set(prof.step_ms) == {"slm", "llm"}
    assert [b for b, _ in prof.step_ms["slm"].points] == [1, 2]
    # the policy hops slm -> llm with p = 0.2 and back with q = 1: llm never stays
    assert prof.routing["llm"] == {"slm": 1.0}
    assert 0 < prof.routing["slm"]["llm"] < 0.6
    assert sum(prof.counts["slm"].values()) >= 4 * 4
    res = runner.invoke(app, ["tune", str(EXAMPLES / "bernoulli.tr"), "--profile", str(out), "-n", "3", "--json",
                              "-o", str(tmp_path / "b.plan")])  # fmt: skip
    assert res.exit_code == 0, res.output
    tuning = json.loads(res.stdout)["tuning"]
    assert tuning["sources"]["step_ms"] == {"slm": "profile", "llm": "profile"}
    assert tuning["sources"]["p"] == {"slm": "profile", "llm": "profile"}


def test_profile_times_each_model_with_its_device_current(monkeypatch):
    """With the models on two GPUs, each model's step latency is timed with that model's GPU current."""
    from fake_devices import fake_devices

    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.throughput.profile import ProfileConfig, run_profile

    tiny = EXAMPLES / "models"
    stdlib = EXAMPLES.parent / "tokenrouter" / "stdlib"
    res = compile_file(stdlib / "bernoulli.tr", {"slm_path": str(tiny / "tiny-small"),
                                                   "llm_path": str(tiny / "tiny-large")})  # fmt: skip
    assert res.plan is not None, [str(d) for d in res.diagnostics]
    seen = fake_devices(monkeypatch, "load_model_runtime")
    cfg = ProfileConfig(batch_sizes=(1, 2), prompts=2, max_tokens=4, repeats=1, warmup=0)
    prof = run_profile(res.plan, cfg)
    assert set(prof.step_ms) == {"slm", "llm"}
    # timed with its own device current; never with the other model's (the executor's sample run scopes
    # each step with the engine's real device, "cpu" here)
    assert {dev for dev, cur in seen if cur == dev} == {"fake-tiny-small", "fake-tiny-large"}
    assert [(dev, cur) for dev, cur in seen if cur and cur.startswith("fake-") and cur != dev] == []


def test_bad_profile_files(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(
        '{"format": "tokenrouter.profile/1", "policy": "x", "step_ms": {"a": {"1": -2}}, "routing": {}}'
    )
    with pytest.raises(ProfileError, match="step_ms.a"):
        read_profile(bad)
    bad.write_text(
        '{"format": "tokenrouter.profile/1", "policy": "x", "step_ms": {}, "routing": {"a": {"a": 0.5}}}'
    )
    with pytest.raises(ProfileError, match="sum to 0.5"):
        read_profile(bad)
    bad.write_text("[1, 2")
    with pytest.raises(ProfileError, match="not valid JSON"):
        read_profile(bad)
    res = runner.invoke(app, ["profile", str(EXAMPLES / "bernoulli.tr"), "--batch-sizes", "1,x"])
    assert res.exit_code == 2 and "bad --batch-sizes" in res.output
