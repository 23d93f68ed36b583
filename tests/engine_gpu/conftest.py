"""Without CUDA, load the Triton kernels under Triton's interpreter (CPU tensors), made faster by
tests/triton_interp.py.

The interpreter is chosen when a kernel is decorated, so the variable must be set while the kernel modules
are (re)loaded, and Triton reads it again at launch, so it stays set for the rest of the session."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import torch

# the kernel modules, each after those it imports from
KERNELS = tuple(
    f"tokenrouter.runtime.engine.kernels.{name}"
    for name in ("common", "attention_shapes", "attention", "elementwise", "linear", "dot_rows")
)

if not torch.cuda.is_available():
    if "triton.language" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # its own @triton.jit functions (tl.sum, tl.max, ...) were decorated for compilation, and no reload of
        # the kernels module changes them: every interpreted kernel would fail to call them
        raise RuntimeError(
            "triton was imported before tests/engine_gpu/conftest.py chose Triton's interpreter: a test module "
            "collected earlier imports it at module level; import it inside the tests instead"
        )
    os.environ["TRITON_INTERPRET"] = "1"  # read at decoration and again at launch: it stays set
    for name in KERNELS:
        if name in sys.modules:
            importlib.reload(sys.modules[name])
    sys.path.insert(0, str(Path(__file__).parents[1]))
    import triton_interp  # noqa: E402

    triton_interp.install()  # one patch of triton.language per kernel run, not one per device-function call
