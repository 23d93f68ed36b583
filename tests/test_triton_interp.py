"""tests/triton_interp.py takes on the installed Triton (a Triton whose interpreter lost the functions it
wraps would leave the CPU kernel tests correct but slow: this says so), a kernel that calls device
functions many times per run, in two runs, computes what torch does, and `tl.fma` rounds once and a loop
may take its bound from `tl.program_id` (what it patches in Triton 3.6's interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

KERNEL = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import sys
sys.path.insert(0, sys.argv[1])
import triton_interp
assert triton_interp.install()
import torch, triton
import triton.language as tl

@triton.jit
def _twice(x):
    return x * 2.0

@triton.jit
def kernel(X, Y, N: tl.constexpr):
    i = tl.program_id(0)
    x = tl.load(X + i * N + tl.arange(0, N))
    y = tl.sum(_twice(x), 0) + tl.max(x, 0) + tl.sum(tl.reshape(_twice(x), [2, N // 2]), 1).sum(0)
    tl.store(Y + i, y)

for run in range(2):
    x = torch.randn(5, 8)
    y = torch.empty(5)
    kernel[(5,)](x, y, N=8)
    want = 4 * x.sum(1) + x.amax(1)
    assert torch.allclose(y, want, atol=1e-5), (run, y, want)
@triton.jit
def fma_and_loop(A, C, R, K):
    i = tl.program_id(0)
    a = tl.load(A + i)
    tl.store(R + i, tl.fma(a, a, -tl.load(C + i)))  # the product's low bits: 0 if rounded twice
    k = tl.zeros([], tl.int32)
    for _ in range(i, 3):  # a loop bound from tl.program_id
        k += 1
    tl.store(K + i, k)

a = torch.tensor([1 + 2**-12, 3.0, 1 + 2**-13])
c = a * a  # rounded to float32
r, k = torch.empty(3), torch.zeros(3, dtype=torch.int32)
fma_and_loop[(3,)](a, c, r, k)
assert r.tolist() == (a.double() * a.double() - c.double()).tolist() == [2**-24, 0.0, 2**-26], r
assert k.tolist() == [3, 2, 1], k
print("OK")
"""


def test_installs_on_this_triton_and_kernels_compute_the_same():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", KERNEL, str(HERE)], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
