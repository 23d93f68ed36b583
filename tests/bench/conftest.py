"""Shared by the tests of the bench/ scripts."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench_script():
    """`load(name)`: the script bench/NAME.py as a module, imported when a test runs. Neither the scripts (they
    import Triton and the kernels) nor triton may be imported while the tests are collected: in a whole-suite
    run tests/engine_gpu/conftest.py, which sets TRITON_INTERPRET, loads only after tests/bench is collected,
    and a Triton imported before that leaves `tl.sum` and the other language functions compiled-only (the
    interpreted kernels then fail with "Cannot call @triton.jit'd outside of the scope of a kernel")."""

    def load(name: str):
        sys.path.insert(0, str(BENCH))
        try:
            return importlib.import_module(name)
        finally:
            sys.path.remove(str(BENCH))

    return load
