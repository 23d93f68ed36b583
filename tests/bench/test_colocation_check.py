"""bench/colocation_check.py on run 44's raw results (docs/matrix): the co-location term changes nothing at
S = 0 and lifts the large-B_llm rows when the small model's step depends on the large one's utilization."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN44 = str(ROOT / "docs/matrix/run44-results.tar.gz")
spec = importlib.util.spec_from_file_location("colocation_check", ROOT / "bench" / "colocation_check.py")
check = importlib.util.module_from_spec(spec)
sys.modules["colocation_check"] = check
spec.loader.exec_module(check)


def rows(lines: list[str]) -> dict[str, list[str]]:
    return {r.split(" | ")[0][2:]: r.strip("| ").split(" | ") for r in lines if r.startswith("| (")}


def test_the_term_moves_the_ranking_as_runs_43_44_measured():
    plain = rows(check.report(RUN44, {}))
    assert set(plain) == {"(1, 1)", "(1, 2)", "(1, 3)", "(1, 4)", "(1, 5)"}
    for r in plain.values():
        assert r[3] == r[4]  # no term: the co-located chain is the plain one
    assert plain["(1, 3)"][1] == "2507" and plain["(1, 3)"][2] == "1.10x"  # measured, against eager
    co = rows(check.report(RUN44, {"slm": 1.3}))
    assert co["(1, 1)"][4] == "1.00x"  # eager's own thresholds: no change
    best = max(co, key=lambda b: float(co[b][4][:-1]))
    assert best == "(1, 3)" and float(co["(1, 3)"][4][:-1]) > float(plain["(1, 3)"][4][:-1])


def test_usage_errors(capsys):
    assert check.main([RUN44, "--slowdown", "big=1"]) == 2
    assert check.main([RUN44, "--slowdown", "slm=x"]) == 2
    assert "expected MODEL=MS" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="nope.tar.gz: not a readable results tarball"):
        check.main(["nope.tar.gz"])
