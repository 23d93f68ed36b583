"""bench/dot_rows_check.py on CPU: the tiny version under Triton's interpreter runs and its dot_rows errors
are bf16 rounding; without CUDA and without --smoke it says so and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "dot_rows_check.py"


def run(*args: str, interpret: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_smoke_under_the_interpreter(tmp_path):
    out = tmp_path / "dot.json"
    proc = run("--smoke", "--rows", "2,16", "--json", str(out), interpret=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["kernel"]
    assert [(r["linear"], r["m"]) for r in rows] == [
        (lin, m) for lin in ("qkv", "o", "gate_up", "down") for m in (2, 16)
    ]
    # bf16 outputs of unit-scale dots: within a few bf16 steps of float64, as cuBLAS is
    assert all(r["dot_err"] < 0.1 and r["cublas_err"] < 0.1 for r in rows), rows
    assert "| tiny | down |" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script times the GPU")
def test_without_cuda_it_says_so():
    proc = run(interpret=False)
    assert proc.returncode == 0 and "needs CUDA" in proc.stderr
