"""bench/retune.py: served runs re-tuned offline from their archives' own scrapes."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN70 = next((ROOT / "docs/raw/run-a1/call3/run70").glob("results-*.tar.gz"))


def test_the_runs_own_tuning_is_reproduced_and_each_served_row_predicted(bench_script, capsys):
    """Run 70's archive: rebuilt from its scrapes with the min_steps its profile was made with, the tuner
    chooses what it chose on the H200, (2, 7) at the same prediction; each served row (eager, the tuned and
    the fixed (2, 5)) gets the chain's prediction at its B and its measured tok/s from the record."""
    retune = bench_script("retune")
    (got,) = retune.retune(RUN70)
    files = retune.read_archive(RUN70)
    then = json.loads(files["tune-n8.json"])["tuning"]["result"]
    assert got["models"] == ("slm", "llm") and got["n"] == 8
    assert got["B"] == got["B_then"] == (2, 7)
    assert got["predicted"] == pytest.approx(then["throughput_tok_s"], rel=1e-9)
    served = {(r["mode"], r["B"]): r for r in got["rows"]}
    assert set(served) == {("eager", (1, 1)), ("tokenrouter", (2, 7)), ("tokenrouter", (2, 5))}
    assert served[("tokenrouter", (2, 7))]["measured"] == pytest.approx(1934.3, abs=0.1)
    assert served[("tokenrouter", (2, 7))]["predicted"] == pytest.approx(then["throughput_tok_s"], rel=1e-9)
    fixed = json.loads(files["tune-0.6b+8b-bern0.35-n8-B2-5.json"])["tuning"]["result"]["throughput_tok_s"]
    assert served[("tokenrouter", (2, 5))]["predicted"] == pytest.approx(fixed, rel=1e-9)
    # another min_steps changes the profile, and so the choice
    (other,) = retune.retune(RUN70, min_steps=20)
    assert other["B"] != (2, 7) and other["B_then"] == (2, 7)
    assert retune.main([str(RUN70)]) == 0
    out = capsys.readouterr().out
    assert "| 0.6b_8b-bern0.35-custom-run70 | 8 | (2, 7) |" in out
    assert "tokenrouter (2, 7) 1934 / 1868 = 1.04" in out and "measured / predicted over 3 served rows" in out


def test_an_archive_without_the_scrapes_is_named(bench_script, tmp_path, capsys):
    retune = bench_script("retune")
    bad = tmp_path / "results-x.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        data = b"{}"
        info = tarfile.TarInfo("raw-x/record-eager-n8.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert retune.main([str(bad)]) == 2
    assert f"error: {bad}: no profile-metrics-nN-after.txt" in capsys.readouterr().err
    assert retune.main(["--min-steps", "0", str(RUN70)]) == 2
    assert retune.main([str(tmp_path / "nope.tar.gz")]) == 2
