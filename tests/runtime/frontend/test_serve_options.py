"""`tokenrouter serve` and `tokenrouter subserver` refuse bad options before anything starts: exit 2, a one-line
message, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app

BERNOULLI = str(Path(__file__).resolve().parents[3] / "examples/bernoulli.tr")


def cli(*args):
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception  # no traceback
    return res


@pytest.mark.parametrize(
    "endpoints, shape", [("[]", "an array"), ("3", "a number"), ('"x"', "a string"), ("null", "null")]
)
def test_subserver_endpoints_of_another_json_shape_say_the_shape(endpoints, shape):
    res = cli("subserver", BERNOULLI, "--model", "slm", "--endpoints", endpoints)
    assert res.exit_code == 2
    assert res.stderr.startswith('error: --endpoints: expected a JSON object {"launcher": URL')
    assert res.stderr.rstrip().endswith(f"got {shape}") and "readable file" not in res.stderr


@pytest.mark.parametrize(
    "option, value", [("--startup-timeout", "nan"), ("--startup-timeout", "0"), ("--heartbeat-timeout", "inf"),
                      ("--heartbeat-timeout", "nan"), ("--liveness-timeout", "0"), ("--liveness-timeout", "inf"),
                      ("--body-timeout", "nan"), ("--body-timeout", "-1")]
)  # fmt: skip
def test_serve_refuses_timeouts_that_are_not_finite_and_positive(option, value):
    res = cli("serve", BERNOULLI, option, value)
    assert res.exit_code == 2
    assert f"error: {option} must be a finite number of seconds > 0, got {float(value)}" in res.stderr


def test_serve_refuses_a_profile_dir_it_cannot_write_into(tmp_path):
    """`--profile-dir` is checked (made if missing) before anything starts: a file there is refused."""
    (tmp_path / "f").write_text("x")
    res = cli("serve", BERNOULLI, "--profile-dir", str(tmp_path / "f"))
    assert res.exit_code == 2
    assert f"error: --profile-dir {tmp_path / 'f'}: not a folder" in res.stderr
    res = cli("serve", BERNOULLI, "--profile-dir", str(tmp_path / "f" / "below"))
    assert res.exit_code == 2
    assert "error: --profile-dir" in res.stderr and "cannot make the folder" in res.stderr


@pytest.mark.parametrize(
    ("host", "key", "warned"),
    [("0.0.0.0", None, True), ("::", None, True), ("myhost.example", None, True), ("0.0.0.0", "k", False),
     ("127.0.0.1", None, False), ("::1", None, False), ("localhost", None, False)],
)  # fmt: skip
def test_serving_to_other_hosts_without_an_api_key_is_warned_about(host, key, warned):
    from tokenrouter.runtime.launcher import exposure_warning

    text = exposure_warning(host, key)
    assert (text is not None) == warned
    if warned:
        assert f"--host {host} without --api-key" in text


def test_serve_takes_defines_as_compile_does(tmp_path):
    """`serve FILE.tr -D NAME=VALUE` binds the param in the plan the subservers read, as `compile -D` does; a
    value the param refuses fails as `compile`'s does (exit 1, the diagnostic), before any process starts."""
    from tokenrouter.compiler.plan import read_plan
    from tokenrouter.runtime.launcher import load_plan

    plan, path = load_plan(BERNOULLI, tmp_path, {"p": "0.5"})
    assert plan["params"]["p"]["value"] == 0.5 and read_plan(path)["params"]["p"]["value"] == 0.5
    res = cli("serve", BERNOULLI, "-D", "p=lots")
    assert res.exit_code == 1 and "-D p=lots: 'lots' is not a float" in res.stderr
    res = cli("serve", BERNOULLI, "-D", "novalue")
    assert res.exit_code == 2 and "expected NAME=VALUE" in res.stderr


def test_serve_refuses_defines_where_they_cannot_apply(tmp_path):
    plan = tmp_path / "b.plan"
    plan.write_text("{}")
    res = cli("serve", plan, "-D", "p=0.5")
    assert (
        res.exit_code == 2
        and "error: -D applies to a .tr policy; a plan's params are already bound" in res.stderr
    )
    res = cli("serve", BERNOULLI, "-D", "p=0.5", "--tcp", "--remote", "llm=10.0.0.2:5601")
    assert res.exit_code == 2 and "error: -D with --remote: compile the policy with -D first" in res.stderr
