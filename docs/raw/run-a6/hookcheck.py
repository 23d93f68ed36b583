"""Thirty-third session: do the Triton JIT hooks (tokenrouter/runtime/engine/kernel_loads.py) count a build on
the device's Triton, and does the build still run with them set? Prints one line; exit 1 where it fails."""

import sys
import time

import torch

from tokenrouter.runtime.engine import kernel_loads
from tokenrouter.runtime.engine.attention import triton_kernels as tk

ok = kernel_loads.install()
x = torch.randn(7, 1000 + int(time.time()) % 24, device="cuda", dtype=torch.bfloat16)  # a size not cached
w = torch.ones(x.shape[1], device="cuda", dtype=torch.bfloat16)
y = tk.rmsnorm(x, w, 1e-6)
want = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
err = (y.float() - want).abs().max().item()
n, ms, names = kernel_loads.LOADS.since((0, 0.0))
print(f"hookcheck: installed={ok} builds={n} ms={ms:.0f} names={names} max_err={err:.3g}")
sys.exit(0 if ok and n >= 1 and err < 0.05 else 1)
