"""`serve`'s start: a line per model per phase of its start-up."""

from __future__ import annotations

import re
import signal

from frontend_helpers import Server, write_policy


def phase_lines(stderr: str, model: str) -> list[str]:
    prefix = f"tokenrouter: model {model}: "
    return [x[len(prefix) :] for x in stderr.splitlines() if x.startswith(prefix)]


def test_start_up_prints_each_models_phases_in_order(tmp_path):
    srv = Server(write_policy(tmp_path), log_dir=tmp_path)
    try:
        stderr = srv.stderr()
    finally:
        assert srv.stop(signal.SIGINT) == 0
    for model in ("slm", "llm"):
        lines = phase_lines(stderr, model)
        expected = [r"starting \(pid \d+\)", r"torch \S+ imported in \d+\.\d s",
                    r"weights loaded in \d+\.\d s \(float32 on cpu\)", r"KV pool of [\d,]+ tokens \(\d+ MiB\)",
                    r"ready on cpu"]  # fmt: skip
        assert len(lines) == len(expected), (model, stderr)  # no CUDA graphs, no Triton kernels on CPU
        for line, pattern in zip(lines, expected, strict=True):
            assert re.fullmatch(pattern, line), (model, line, stderr)
