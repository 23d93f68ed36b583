"""bench/gemv_rows_check.py, the small version under Triton's interpreter (CPU): it runs, every case it
checks is within rounding, and without CUDA the GPU version says so and exits 0.

The small version runs with tests/triton_interp.py installed first (the script run as __main__, with the
same arguments): it patches triton.language once per kernel run instead of at every device-function call,
nearly half of the run's time otherwise, and the GEMV, norm and attention kernels use no `tl.fma`, the one
op whose rounding it changes, so the script computes the same values."""

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


# `python -c FAST_INTERPRETER TESTS SCRIPT ARGS`: triton_interp installed (TRITON_INTERPRET set in the
# environment before triton is imported, as the script's --interpret sets it), then SCRIPT run as
# `python SCRIPT ARGS` would (its argv, its folder first on sys.path)
FAST_INTERPRETER = (
    "import os, runpy, sys; sys.path.insert(0, sys.argv.pop(1)); import triton_interp; "
    "assert triton_interp.install(); sys.argv.pop(0); sys.path.insert(0, os.path.dirname(sys.argv[0])); "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def run(*args: str, fast_interpreter: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, str(SCRIPT), *args]
    if fast_interpreter:
        env["TRITON_INTERPRET"] = "1"
        cmd = [sys.executable, "-c", FAST_INTERPRETER, str(ROOT / "tests"), str(SCRIPT), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_interpreter_version_runs_and_finds_no_mismatch(tmp_path):
    out = tmp_path / "check.json"
    proc = run("--interpret", "--rows", "3", "--layers", "1", "--json", str(out), fast_interpreter=True)
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
