"""The Triton route kernel against the torch renderer: under Triton's interpreter on CPU (in a fresh
process, since TRITON_INTERPRET must be set before triton is imported), compiled for sm_90 without a GPU,
and compiled for real on a GPU (marked gpu: the small-shape script covers every hand-written case and the
routers, route_gpu_check.py the full vocabulary at bs 1 / 8 / 64; every stdlib policy runs under the
interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _script(args: list[str], interpret: bool, timeout: int = 300) -> str:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, *args], cwd=HERE, env=env, capture_output=True, text=True,
                         timeout=timeout)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    return res.stdout


@pytest.mark.parametrize("sampler", ["cdf", "strided"])
def test_triton_interpreter_matches_torch(tmp_path, sampler):
    out = _script(["route_interp_check.py", str(tmp_path), "cpu", sampler], interpret=True)
    assert "OK" in out and f"sampler {sampler}" in out


def test_triton_kernels_compile_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    out = _script(["route_compile_check.py"], interpret=False)
    assert "OK compiled" in out


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("sampler", ["cdf", "strided"])
def test_compiled_triton_matches_torch_small(tmp_path, sampler):
    out = _script(["route_interp_check.py", str(tmp_path), "cuda", sampler], interpret=False)
    assert "OK" in out and f"sampler {sampler}" in out


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("sampler", ["cdf", "strided"])
def test_compiled_triton_matches_torch_full_vocab(sampler):
    out = _script(["route_gpu_check.py", "1,8,64", "151936", sampler], interpret=False, timeout=900)
    assert "OK" in out and f"sampler {sampler}" in out
