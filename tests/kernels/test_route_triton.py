"""The Triton route kernel against the torch renderer: under Triton's interpreter on CPU (in a fresh
process, since TRITON_INTERPRET must be set before triton is imported), compiled for sm_90 without a GPU,
and compiled for real on a GPU (marked gpu: the small-shape script covers every hand-written case and the
routers, the full-vocabulary test the split choices of bs 1 / 8 / 64; every stdlib policy runs under the
interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from route_cases import CASES
from route_inputs import extreme_logits, mixed_state, random_logits, tie_logits

from tokenrouter.runtime.route import RouteBatchState, RouteKernel

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


def test_triton_interpreter_matches_torch(tmp_path):
    out = _script(["route_interp_check.py", str(tmp_path), "cpu"], interpret=True)
    assert "OK" in out


def test_triton_kernels_compile_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    out = _script(["route_compile_check.py"], interpret=False)
    assert "OK compiled" in out


def _to(state: RouteBatchState, device) -> RouteBatchState:
    names = ("seed", "position", "temperature", "top_k", "top_p", "run_length", "generated")
    return RouteBatchState(*[getattr(state, n).to(device) for n in names])


@pytest.mark.gpu
@cuda
def test_compiled_triton_matches_torch_small(tmp_path):
    out = _script(["route_interp_check.py", str(tmp_path), "cuda"], interpret=False)
    assert "OK" in out


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("rows", [1, 8, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_triton_matches_torch_full_vocab(rows, dtype):
    dev = torch.device("cuda")
    vocab = 151_936
    for name in ("citer_like",):  # every statistic; the small-shape script covers the other cases
        plan = {"routes": {"slm": CASES[name]()}, "routers": {}, "models": {}}
        ref = RouteKernel(plan, "slm", "torch", dev)
        tri = RouteKernel(plan, "slm", "triton", dev)
        for make in (random_logits, tie_logits, extreme_logits):
            logits = make(max(rows, 6), vocab, seed=rows)[:rows].to(dtype).to(dev)
            state = _to(mixed_state(rows), dev)
            a = ref(logits, None, state, with_features=True)
            b = tri(logits, None, state, with_features=True)
            assert torch.equal(a.token, b.token), (name, make.__name__)
            assert torch.equal(a.rule, b.rule), (name, make.__name__)
            torch.testing.assert_close(a.logprob, b.logprob, rtol=1e-5, atol=2e-4)
            for key, want in a.features.items():
                got = b.features[key]
                if want.dtype.is_floating_point:
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5, msg=f"{name} {key}")
                else:
                    assert torch.equal(got, want), (name, key)
