"""Warming the Triton route kernel at start (`RouteKernel.warm`): one launch per launch variant, so that no
serving step waits for Triton to build one. On the H200, served steps that first met a variant stalled
290-570 ms (at N = 16)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path
from unittest import mock

import torch
from route_cases import CASES

from tokenrouter.compiler.kernels import check_route_ir, render_route_kernel
from tokenrouter.runtime.route.kernel import load_source
from tokenrouter.runtime.route.triton_backend import TritonRoute

HERE = Path(__file__).parent


def test_the_route_kernels_leave_the_row_count_unspecialized():
    # Triton builds a variant for an int argument of 1 and another for multiples of 16: a batch of 16 rows
    # would be a build of its own (the served stalls on the H200 were at 16 rows)
    # compiled, not interpreted, whatever this worker's environment says (tests/engine_gpu/conftest.py sets
    # TRITON_INTERPRET for its whole process, and Triton reads it when a kernel is decorated)
    with mock.patch.dict(os.environ):
        os.environ.pop("TRITON_INTERPRET", None)
        mod = load_source(
            render_route_kernel(check_route_ir(CASES["citer_like"](), "slm"), "triton"), "warm_t"
        )
    for fn in (mod.route_kernel, mod.rules_kernel):
        assert [p.name for p in fn.params if p.do_not_specialize] == ["n_rows"]


def test_variants_are_one_batch_for_each_launch_configuration_of_an_h200():
    tr = TritonRoute(types.SimpleNamespace(FLOAT_SLOTS=()), torch.device("cpu"), None, None)
    tr.device = torch.device("cuda")  # config() reads only the SM count of a CUDA device
    props = types.SimpleNamespace(multi_processor_count=132)
    with mock.patch("torch.cuda.get_device_properties", return_value=props):
        variants = tr.variants(256, 151936, 2)
        firsts = [1, 5, 9, 17, 34, 67, 133]  # the row counts where the split per row halves (2 x 132 SMs)
        assert variants == [(r, False) for r in firsts] + [(r, True) for r in firsts]
        configs = {(s, tr.config(r, 151936, 2, s)) for r, s in variants}
        assert len(configs) == 14
        assert all((s, tr.config(r, 151936, 2, s)) in configs for r in range(1, 257) for s in (False, True))
        assert tr.variants(4, 151936, 2) == [(1, False), (1, True)]


def test_a_warmed_kernel_routes_as_a_cold_one_under_the_interpreter():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    res = subprocess.run([sys.executable, "route_warm_check.py"], cwd=HERE, env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    assert "OK warmed in 4 launches" in res.stdout
