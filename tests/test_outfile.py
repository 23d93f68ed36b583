"""The one writer of plans and profiles (`tokenrouter.outfile`): it never loses the user's files.

An audit found `compile p.tr -o p.tr` replacing the policy with its plan, `-o link.plan` replacing a symbolic link
with a file, `-o FIFO` and `-o /dev/full` (as root) replacing the special file, and a failed write leaving
`OUT.tmp` behind; `profile -o FOLDER` failed only after the measurement.
"""

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.outfile import OutputPathError, write_replacing

runner = CliRunner()

POLICY = """policy tiny
model slm = "s" { batch: 1 }
model llm = "l" { batch: auto }
serve { concurrency: 4 }
entry slm
route slm {
  when uniform() < 0.35 -> llm drop
}
route llm { -> slm }
"""


def test_the_writer_refuses_what_would_lose_data_and_writes_through_links(tmp_path):
    src = tmp_path / "p.tr"
    src.write_text("policy p\n")
    for path, message in [
        (src, r"is a policy source \(\.tr\)"),
        (tmp_path / "other.tr", r"is a policy source \(\.tr\)"),
        (tmp_path, "is a folder"),
        (tmp_path / "missing" / "x.plan", "no folder"),
    ]:
        with pytest.raises(OutputPathError, match=message):
            write_replacing(path, "{}")
    given = tmp_path / "profile.json"
    given.write_text("{}")
    with pytest.raises(OutputPathError, match="is this command's input"):
        write_replacing(given, "x", inputs=[str(given)])
    fifo = tmp_path / "f.plan"
    os.mkfifo(fifo)
    with pytest.raises(OutputPathError, match="is not a regular file"):
        write_replacing(fifo, "{}")
    assert src.read_text() == "policy p\n" and given.read_text() == "{}"
    link = tmp_path / "link.plan"
    link.symlink_to("real.plan")
    assert write_replacing(link, "one") == (tmp_path / "real.plan").resolve()
    assert link.is_symlink() and link.read_text() == "one"
    write_replacing(link, "two")
    assert link.is_symlink() and (tmp_path / "real.plan").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "f.plan",
        "link.plan",
        "p.tr",
        "profile.json",
        "real.plan",
    ]


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    out = tmp_path / "out.plan"
    out.write_text("old")

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space left"):
        write_replacing(out, "new")
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.plan"]


def test_commands_refuse_such_outputs_before_their_work(tmp_path, monkeypatch):
    src = tmp_path / "p.tr"
    src.write_text(POLICY)
    res = runner.invoke(app, ["compile", str(src), "-o", str(src), "--no-weights-check"])  # models "s", "l"
    assert res.exit_code == 1 and "cannot write" in res.output and "policy source" in res.output
    assert src.read_text() == POLICY and "Traceback" not in res.output
    res = runner.invoke(
        app, ["tune", str(src), "--step-ms", "slm=6", "--step-ms", "llm=28", "-o", str(tmp_path)]
    )
    assert res.exit_code == 1 and "is a folder" in res.output, res.output
    plan = tmp_path / "p.plan"
    assert runner.invoke(app, ["compile", str(src), "-o", str(plan), "--no-weights-check"]).exit_code == 0
    before = plan.read_text()

    def measured(*_a, **_k):  # the measurement must not start
        raise AssertionError("profile measured before checking its output path")

    monkeypatch.setattr("tokenrouter.throughput.profile.run_profile", measured)
    for out, message in [
        (tmp_path, "is a folder"),
        (plan, "is this command's input"),
        (src, "policy source"),
    ]:
        res = runner.invoke(app, ["profile", str(plan), "-o", str(out), "--device", "cpu"])
        assert res.exit_code == 1 and message in res.output and "Traceback" not in res.output, res.output
    assert plan.read_text() == before and Path(src).read_text() == POLICY


def test_finite_json_writes_null_for_nan_and_infinity():
    from tokenrouter.outfile import finite_json

    got = finite_json(
        {"a": float("nan"), "b": [1.0, float("inf"), (2, -float("inf"))], "c": {"d": 3}, "e": "x"}
    )
    assert got == {"a": None, "b": [1.0, None, [2, None]], "c": {"d": 3}, "e": "x"}
