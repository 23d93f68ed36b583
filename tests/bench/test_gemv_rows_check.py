"""bench/gemv_rows_check.py, the small version under Triton's interpreter (CPU): it runs, every case it
checks is within rounding, and without CUDA the GPU version says so and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gemv_rows_check.py"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_interpreter_version_runs_and_finds_no_mismatch(tmp_path):
    out = tmp_path / "check.json"
    proc = run("--interpret", "--rows", "3", "--layers", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    kernel, model = results["kernel"], results["model"]
    # 5 layer / variant cases x pdl at M 3; the model: q 3 x pdl, eager
    assert len(kernel) == 5 * 2 and len(model) == 2
    assert all(r["ok"] for r in kernel + model), [r for r in kernel + model if not r["ok"]]
    assert "## Mismatches by switch" in proc.stdout and "kernel, by pdl: True: 0/5, False: 0/5" in proc.stdout
    assert "x_once" not in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_without_cuda_it_says_so_and_exits_0():
    proc = run()
    assert proc.returncode == 0 and "no CUDA device" in proc.stdout
