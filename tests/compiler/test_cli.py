"""`tokenrouter check | compile | fmt | inspect`: output and exit status (0 ok, 1 input errors, 2 usage)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from tokenrouter.cli import app

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "diagnostics"
runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_check_clean_files_exit_0() -> None:
    r = run("check", str(REPO / "examples" / "bernoulli.tr"), str(REPO / "examples" / "r_stitch.tr"))
    assert r.exit_code == 0, r.output
    assert "bernoulli.tr: ok" in r.output and "r_stitch.tr: ok" in r.output


def test_check_warnings_do_not_fail() -> None:
    r = run("check", "--no-weights-check", str(FIX / "warnings_only.tr"))
    assert r.exit_code == 0
    assert ": warning: router 'gate': weights not found" in r.output and "ok (3 warnings)" in r.output


def test_missing_weights_fail_check_and_compile_unless_asked(tmp_path: Path) -> None:
    r = run("check", str(FIX / "warnings_only.tr"))
    assert r.exit_code == 1
    assert ": error: router 'gate': weights not found" in r.output and "--no-weights-check" in r.output
    assert "init-router" not in r.output
    out = tmp_path / "w.plan"
    r = run("compile", str(FIX / "warnings_only.tr"), "-o", str(out))
    assert r.exit_code == 1 and not out.exists()
    r = run("compile", "--no-weights-check", str(FIX / "warnings_only.tr"), "-o", str(out))
    assert r.exit_code == 0 and out.exists(), r.output


def test_check_reports_every_error_of_every_file() -> None:
    r = run(
        "check", str(FIX / "options.tr"), str(FIX / "rule_checks.tr"), str(REPO / "examples" / "bernoulli.tr")
    )
    assert r.exit_code == 1
    assert r.output.count(": error: ") == 13 + 5
    assert "options.tr: 13 errors, 0 warnings" in r.output and "bernoulli.tr: ok" in r.output


def test_check_caps_the_list() -> None:
    r = run("check", "--max-errors", "3", str(FIX / "options.tr"))
    assert r.exit_code == 1
    assert r.output.count(": error: ") == 3 and "… and 10 more" in r.output


def test_missing_file_is_a_usage_error() -> None:
    r = run("check", str(FIX / "does_not_exist.tr"))
    assert r.exit_code == 2 and "no such file" in r.output


@pytest.mark.parametrize("value", ["0", "-1"])
def test_max_errors_below_1_is_a_usage_error(value: str) -> None:
    r = run("check", "--max-errors", value, str(FIX / "options.tr"))
    assert r.exit_code == 2 and "--max-errors" in r.output and "more" not in r.output


@pytest.mark.parametrize("cmd", ["check", "fmt", "inspect"])
def test_a_directory_or_device_is_not_called_missing(cmd: str, tmp_path: Path) -> None:
    (tmp_path / "d.tr").mkdir()
    r = run(cmd, str(tmp_path / "d.tr"))
    assert r.exit_code == 2 and f"error: {tmp_path / 'd.tr'}: is a directory, not a file" in r.output
    r = run(cmd, "/dev/null")
    assert r.exit_code == 2 and "error: /dev/null: is not a regular file" in r.output


def test_bad_define_syntax_is_a_usage_error_and_bad_value_an_input_error() -> None:
    r = run("check", "-D", "novalue", str(REPO / "examples" / "bernoulli.tr"))
    assert r.exit_code == 2 and "expected NAME=VALUE" in r.output
    r = run("check", "-D", "p=lots", str(REPO / "examples" / "bernoulli.tr"))
    assert r.exit_code == 1 and "-D p=lots: 'lots' is not a float" in r.output


def test_compile_writes_the_plan_beside_the_source_and_inspect_reads_it(tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples", tmp_path / "ex", ignore=shutil.ignore_patterns("*.plan", "models"))
    (tmp_path / "ex" / "models").symlink_to(REPO / "examples" / "models")
    src = tmp_path / "ex" / "citer.tr"
    # citer's router is not shipped
    r = run("compile", str(src), "-D", "threshold=0.25", "--no-weights-check")
    assert r.exit_code == 0, r.output
    plan = tmp_path / "ex" / "citer.plan"
    assert plan.exists() and f"wrote {plan}" in r.output
    r = run("inspect", str(plan))
    assert r.exit_code == 0, r.output
    for text in ["slm: ", "(entry)", "[0] line 21: when sigmoid(gate) > threshold -> llm drop",
                 "threshold: float = 0.25", "feasibility: ok", "auto (resolved by tune; at least 1): llm, slm"]:  # fmt: skip
        assert text in r.output
    r = run("inspect", "--json", str(plan))
    assert r.exit_code == 0 and json.loads(r.output)["params"]["threshold"]["value"] == 0.25


def test_inspect_shows_what_tune_chose(tmp_path: Path) -> None:
    src = tmp_path / "p.tr"
    src.write_text(
        'policy duo\nmodel slm = "s" { batch: 1 }\nmodel llm = "l" { batch: auto }\nserve { concurrency: 4 }\n'
        "entry slm\nroute slm { when uniform() < 0.35 -> llm drop }\nroute llm { -> slm }\n"
    )
    assert "tuning:" not in run("inspect", str(src)).output
    r = run("tune", str(src), "--step-ms", "slm=6", "--step-ms", "llm=27.9", "--gap-ms", "slm=0.3")
    assert r.exit_code == 0, r.output
    r = run("inspect", str(tmp_path / "p.plan"))
    assert r.exit_code == 0, r.output
    assert (
        "tuning:\n  N = 4, by the chain (exhaustive search, δ 0.1 ms): B* slm 1, llm 3, T 203.3 tok/s predicted"
        in r.output
    )
    assert "host time per step, added in the chain: slm 0.3 ms, llm 0 ms" in r.output
    assert "step latencies from: slm --step-ms, llm --step-ms" in r.output


def test_compile_with_errors_writes_nothing(tmp_path: Path) -> None:
    r = run("compile", str(FIX / "deadlock.tr"), "-o", str(tmp_path / "x.plan"))
    assert r.exit_code == 1 and "delayed batching can deadlock" in r.output
    assert "deadlock.tr: not compiled (1 error)\n" in r.output
    assert not (tmp_path / "x.plan").exists()


def test_inspect_compiles_a_policy_as_serve_does() -> None:
    r = run("inspect", str(REPO / "examples" / "r2r.tr"))
    assert r.exit_code == 0, r.output
    assert "not valid JSON" not in r.output and "(entry)" in r.output and "threshold: float = 0.5" in r.output
    r = run("inspect", str(FIX / "deadlock.tr"))
    assert r.exit_code == 1 and "not compiled" in r.output and "delayed batching can deadlock" in r.output
    assert "not valid JSON" not in r.output and "Traceback" not in r.output


def test_inspect_broken_plan_exits_1(tmp_path: Path) -> None:
    (tmp_path / "p.plan").write_text('{"format": "tokenrouter.plan/9"}')
    r = run("inspect", str(tmp_path / "p.plan"))
    assert r.exit_code == 1 and "not supported" in r.output and "Traceback" not in r.output


def test_fmt_check_and_in_place(tmp_path: Path) -> None:
    f = tmp_path / "m.tr"
    f.write_text('policy m\nmodel a="x"{gpu:0}\nentry a\n')
    r = run("fmt", "--check", str(f))
    assert r.exit_code == 1 and "would reformat" in r.output
    r = run("fmt", str(f))
    assert r.exit_code == 0 and f.read_text() == 'policy m\nmodel a = "x" { gpu: 0 }\nentry a\n'
    assert run("fmt", "--check", str(f)).exit_code == 0
    f.write_text("policy m\nmodel a = \n")
    r = run("fmt", str(f))
    assert r.exit_code == 1 and ": error: " in r.output and f.read_text() == "policy m\nmodel a = \n"


def test_no_subcommand_argument_is_usage_error() -> None:
    assert run("compile").exit_code == 2


@pytest.mark.parametrize("cmd", [["check", "tests/fixtures/diagnostics/syntax_errors.tr"]])
def test_console_script_prints_no_traceback(cmd: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tokenrouter.cli", *cmd], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("tests/fixtures/diagnostics/syntax_errors.tr:3:9: error: unexpected 'int'")


def test_version() -> None:
    from tokenrouter import __version__

    r = run("--version")
    assert r.exit_code == 0 and r.output == f"tokenrouter {__version__}\n"


COMMANDS = sorted(typer.main.get_command(app).commands)


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)])
def test_help_names_parameters_without_python_types(command: list[str]) -> None:
    """No `<bool>` / `<list[str]>` tags; the usage line names arguments in capitals, as `FILES...` or
    `PLAN` (`[OUT]` when optional), never `{file}`."""
    r = runner.invoke(app, [*command, "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert not re.search(r"<(bool|str|int|float|list\[|path)", r.output), r.output
    usage = next(line for line in r.output.splitlines() if "Usage:" in line)
    pieces = usage.split("[OPTIONS]", 1)[1].split()
    assert all(re.fullmatch(r"\[?[A-Z][A-Z_]*(\.\.\.)?\]?(\.\.\.)?", p) for p in pieces), usage


def test_the_readme_policy_is_a_shipped_example_whose_files_are_there() -> None:
    """The README's example policy is `examples/r2r_kd.tr` as shipped (it named a router file that no example
    has), and `check` finds every file it names: no 'not found' warning."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("## A policy", 1)[1].split("```\n", 2)[1]
    shipped = (REPO / "examples/r2r_kd.tr").read_text()
    assert shipped.endswith(block) and block.startswith("policy ")
    r = run("check", str(REPO / "examples/r2r_kd.tr"))
    assert r.exit_code == 0 and r.output.strip().endswith("r2r_kd.tr: ok"), r.output
