"""`tokenrouter serve --mode/--llm` usage: bad usage exits 2, a wrong model name exits 1, both with a
message and no traceback, before any process starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--mode", "fast"], 2, "--mode must be one of tokenrouter, llm-only, lockstep"),
        (["--mode", "eager", "--llm", "llm"], 2, "--llm applies to --mode llm-only only"),
        (
            ["--mode", "llm-only", "--llm", "big"],
            1,
            "--llm 'big' is not a model of the plan (models: slm, llm)",
        ),
        (["--batch", "llm=x"], 2, "--batch"),
        (["--batch", "big=2"], 1, "--batch big: not a model of the plan (models: slm, llm)"),
        (["--mode", "eager", "--batch", "llm=2"], 1, "--batch applies to --mode tokenrouter and no-graphs"),
        (["--batch", "llm=8"], 1, "--batch: delayed batching can deadlock"),
        (["--cpu-threads", "0"], 2, "--cpu-threads 0: at least 1"),
    ],
)
def test_serve_mode_usage(args, status, message):
    cmd = [sys.executable, "-m", "tokenrouter.cli", "serve", "examples/bernoulli.tr", "--port", "0", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == status
    assert message in proc.stderr and "Traceback" not in proc.stderr
