"""The training and quality commands check what would otherwise fail only after their work (a router file that
cannot be written, sequences longer than the models' context, a router too large for memory) up front, with a
message and no traceback. The serving commands' checks: tests/runtime/frontend/test_serve_options.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app

REPO = Path(__file__).resolve().parents[2]
KD = str(REPO / "examples/r2r_kd.tr")  # py-small-kd and py-large: 1024 tokens of context
BERNOULLI = str(REPO / "examples/bernoulli.tr")


def cli(*args):
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception  # no traceback
    return res


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.py").write_text("def f(x):\n    return x + 1\n" * 20)
    return folder


def test_init_router_refuses_a_folder_or_a_file_as_the_output_before_writing(tmp_path):
    res = cli("init-router", KD, "divergence", "-o", tmp_path)
    assert res.exit_code == 1 and f"-o {tmp_path}: is a folder" in res.stderr
    (tmp_path / "f").write_text("")
    res = cli("init-router", KD, "divergence", "-o", tmp_path / "f" / "r.safetensors")
    assert res.exit_code == 1 and "f is a file, not a folder" in res.stderr


def test_init_router_bounds_the_router_size():
    t0 = time.perf_counter()
    res = cli("init-router", KD, "divergence", "-o", "/nowhere/r.safetensors", "--hidden-layers", "100000000")
    assert res.exit_code == 2, res.output
    assert "--hidden-layers 100000000: router 'divergence' (356 -> 100000000 -> 1) would have" in res.stderr
    assert time.perf_counter() - t0 < 30  # nothing allocated


def test_train_router_checks_its_options_before_teacher_forcing(tmp_path, data):
    args = ["train-router", KD, "divergence", "--data", data, "--max-tokens", "100", "--seq-len", "64"]
    res = cli(*args, "-o", tmp_path)
    assert res.exit_code == 1 and f"-o {tmp_path}: is a folder; give a file name" in res.stderr
    out = ["-o", tmp_path / "r.safetensors"]
    res = cli(*args, *out, "--hidden-layers", "abc")
    assert (
        res.exit_code == 2
        and "--hidden-layers: hidden layer sizes must be a comma-separated list" in res.stderr
    )
    assert "invalid literal" not in res.stderr
    res = cli(*args, *out, "--hidden-layers", "100000000")
    assert res.exit_code == 2 and "would have 3.58e+10 weights" in res.stderr
    res = cli(*args, *out, "--cache", BERNOULLI)
    assert res.exit_code == 2 and f"--cache {BERNOULLI}: {BERNOULLI} is a file, not a folder" in res.stderr
    res = cli(*args[:-1], "100000", *out)
    assert res.exit_code == 2
    assert "--seq-len 100000: sequences of 100000 tokens, but model 'slm' takes 1024 at most" in res.stderr
    assert not (tmp_path / "r.safetensors").exists()


def test_library_train_router_refuses_a_folder_as_the_router_file(tmp_path, data):
    from tokenrouter.training.policy_view import load_plan
    from tokenrouter.training.router_train import RouterTrainConfig, train_router
    from tokenrouter.training.teacher import TeacherConfig

    with pytest.raises(ValueError, match="is a folder; give a file name"):
        train_router(
            load_plan(KD), "divergence", data, tmp_path, TeacherConfig(seq_len=64), RouterTrainConfig()
        )


def test_eval_checks_its_options_before_teacher_forcing(data):
    args = ["eval", KD, "--data", data, "--max-tokens", "100", "--seq-len", "64"]
    res = cli(*args, "--shares", "abc")
    assert res.exit_code == 2 and "--shares 'abc': expected fractions in (0, 1)" in res.stderr
    assert "could not convert" not in res.stderr
    res = cli(*args, "--generate", "1", "--max-new-tokens", "2000")
    assert res.exit_code == 2
    assert "--max-new-tokens 2000 after a prompt of up to 128 tokens: sequences of 2128 tokens" in res.stderr
    res = cli(*args[:-1], "4096")
    assert res.exit_code == 2 and "--seq-len 4096: sequences of 4096 tokens" in res.stderr
    res = cli(*args, "--cache", BERNOULLI)
    assert res.exit_code == 2 and "is a file, not a folder" in res.stderr


def test_calibrate_refuses_more_tokens_than_the_context_holds():
    res = cli("calibrate", BERNOULLI, "--share", "0.3", "--param", "p", "--max-tokens", "100000",
              "--num-prompts", "1", "--iterations", "1", "--device", "cpu")  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "--prompt-len 32 and --max-tokens 100000: sequences of 100032 tokens, but model" in res.stderr
    assert "takes 1024 at most" in res.stderr


def test_init_router_keeps_a_file_that_is_there_unless_forced(tmp_path):
    """Without -o it would write over the policy's own router (the shipped examples' trained ones)."""
    out = tmp_path / "r.safetensors"
    out.write_bytes(b"trained")
    res = cli("init-router", KD, "divergence", "-o", out)
    assert (
        res.exit_code == 2 and f"error: {out} exists" in res.stderr and "--force overwrites it" in res.stderr
    )
    assert out.read_bytes() == b"trained"
    res = cli("init-router", KD, "divergence", "-o", out, "--force")
    assert res.exit_code == 0, res.output
    assert out.read_bytes() != b"trained" and f"wrote {out}: untrained mlp router" in res.stdout
    (tmp_path / "routers").mkdir()  # the policy's own path, beside a copy of it
    own = tmp_path / "routers/py_kd_r2r_divergence.safetensors"
    trained = (REPO / "examples/routers" / own.name).read_bytes()
    own.write_bytes(trained)
    (tmp_path / "kd.tr").write_text(Path(KD).read_text())
    res = cli("init-router", tmp_path / "kd.tr", "divergence", "--hidden-size", "8")
    assert res.exit_code == 2 and f"error: {own} exists" in res.stderr and own.read_bytes() == trained
