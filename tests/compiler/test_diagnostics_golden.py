"""Golden diagnostics: each tests/fixtures/diagnostics/NAME.tr beside NAME.expected (the rendered
diagnostics, file paths relative to the fixtures folder). A `# defines: a=1 b=2` line passes -D values; a
`# --no-weights-check` line compiles as that flag does.
Regenerate after an intended change with TR_UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tokenrouter.compiler.driver import compile_file
from tokenrouter.dsl.diagnostics import render_all

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "diagnostics"
PREFIX = "tests/fixtures/diagnostics/"
CASES = sorted(p.stem for p in FIXTURES.glob("*.tr"))


def render_case(name: str) -> str:
    """Compile one fixture from the repository root (paths in messages are shown relative to it)."""
    path = FIXTURES / f"{name}.tr"
    text = path.read_text(encoding="utf-8")
    defines = {}
    m = re.search(r"^# defines: (.*)$", text, re.M)
    if m:
        defines = dict(item.split("=", 1) for item in m.group(1).split())
    weights_check = re.search(r"^# --no-weights-check$", text, re.M) is None
    result = compile_file(PREFIX + f"{name}.tr", defines, weights_check)
    out = render_all(result.diagnostics, limit=1000).replace(PREFIX, "")
    status = "ok" if result.plan is not None else "rejected"
    return f"{status}\n{out}\n"


@pytest.mark.parametrize("name", CASES)
def test_golden(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("HF_HUB_CACHE", "/hf-cache")  # a hub id's warning names the cache: the same everywhere
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    got = render_case(name)
    expected_path = FIXTURES / f"{name}.expected"
    if os.environ.get("TR_UPDATE_GOLDEN"):
        expected_path.write_text(got, encoding="utf-8")
    assert expected_path.exists(), f"missing {expected_path}; run with TR_UPDATE_GOLDEN=1 and review it"
    assert got == expected_path.read_text(encoding="utf-8")


def test_every_fixture_has_expected_output() -> None:
    assert CASES, "no fixtures found"
    missing = [n for n in CASES if not (FIXTURES / f"{n}.expected").exists()]
    assert not missing
