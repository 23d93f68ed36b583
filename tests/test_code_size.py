"""The package's size targets (`bench/code_stats.py` prints the figures): no module over 600 lines, function
length p90 at most 25 lines, and no function over 120 lines except GPU kernels."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("code_stats", ROOT / "bench" / "code_stats.py")
stats = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stats)
FILES = sorted(stats.PACKAGE.rglob("*.py"))


def test_no_module_is_over_600_lines():
    limit = stats.MAX_MODULE_LINES
    over = {str(p.relative_to(ROOT)): n for p in FILES if (n := len(p.read_text().splitlines())) > limit}
    assert not over, f"split these modules: {over}"


def test_functions_are_short_and_only_gpu_kernels_are_long():
    found = [(p, name, n) for p in FILES for name, n in stats.functions(p)]
    assert stats.percentile([n for *_, n in found], 90) <= stats.MAX_P90
    long = [f"{p.relative_to(ROOT)}:{name} ({n})" for p, name, n in found
            if n > stats.MAX_FUNCTION_LINES and not stats.is_kernel(p, name)]  # fmt: skip
    assert not long, f"split these functions: {long}"


def test_the_measure_counts_what_it_says(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "def a():\n    x = 1\n    return x\n\n\nclass C:\n    def b(self):\n        def c():\n            pass\n\n        return c\n"
    )
    assert stats.functions(f) == [("a", 3), ("C.b", 5), ("C.b.c", 2)]
    assert stats.percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90) == 9
