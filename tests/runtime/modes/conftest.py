"""Helpers of the serving-mode tests: the subserver tests' tiny-model plans, and in-process drivers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "subserver"))  # subserver_helpers: plans on the tiny models
sys.path.insert(0, str(HERE.parents[1]))  # fake_devices: per-model device scopes recorded on the CPU


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: thread fan-out only costs time on the shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
