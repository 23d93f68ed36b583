"""bench/startup_bench.py runs its three starts end to end on CPU (tiny model: no graphs, no autotuning)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = [sys.executable, str(ROOT / "bench" / "startup_bench.py")]


def test_cpu_smoke(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([*SCRIPT, "--shapes", "tiny", "--device", "cpu", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads((out / "startup_bench.json").read_text())
    assert [(x["shape"], x["start"], x["autotune_cache"]) for x in rows] == [
        ("tiny", "cold", True), ("tiny", "retune", False), ("tiny", "warm", True)]  # fmt: skip
    for x in rows:
        assert 0 < x["import_s"] < x["built_s"] < x["process_s"]
        assert x["graphs"] == 0 and x["tuned_kernels"] == 0
    assert r.stdout.count("| tiny |") == 3
    again = subprocess.run([*SCRIPT, "--shapes", "tiny", "--device", "cpu", "--out", str(out)],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 1 and "needs an empty Triton cache" in again.stderr
