"""bench/step_profile.py runs end to end on CPU (tiny model) and rejects bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = [sys.executable, str(ROOT / "bench" / "step_profile.py")]


def test_cpu_smoke(tmp_path):
    r = subprocess.run([*SCRIPT, "--shape", "tiny", "--device", "cpu", "--rows", "1,3", "--steps", "3",
                        "--warmup", "1", "--host-split", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "| rows | step ms (as served) | engine ms | route ms | rest ms |" in r.stdout
    rows = json.loads((tmp_path / "step_profile.json").read_text())
    assert [x["rows"] for x in rows] == [1, 3]
    assert all(x["engine"] > 0 and x["step_ms"] > 0 for x in rows)
    split = rows[0]["host_split_ms"]  # every wrapped function ran, and none takes longer than the step
    assert {"ForwardBatch.build", "RouteKernel.__call__", "Scheduler.process_batch_result"} <= set(split)
    assert 0 < split["ForwardBatch.build"] < split["HeldRequestsEngine.forward"] <= split["step_ms"]
    assert "| function |" in r.stdout


def test_bad_rows():
    r = subprocess.run([*SCRIPT, "--rows", "a,b"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "bad --rows 'a,b'" in r.stderr


def test_cpu_stub_graphs(tmp_path):
    """--stub-graphs: the steps take the graph runner's host path (load_batch, no model forward)."""
    r = subprocess.run([*SCRIPT, "--shape", "tiny", "--device", "cpu", "--rows", "1,4", "--steps", "3",
                        "--warmup", "1", "--host-split", "--stub-graphs", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "step_profile.json").read_text())
    assert all(x["graphs"] for x in rows)
    split = rows[1]["host_split_ms"]
    assert split["CudaGraphRunner.load_batch"] > 0 and "EmbeddedEngine._run_model" in split
    phases = [v for k, v in split.items() if k.startswith("phase: ")]
    assert len(phases) == 3 and all(v >= 0 for v in phases)
    assert sum(phases) <= split["step_ms"] * 1.01
