"""Where the package stands against its size and layering targets: the largest modules (lines), function length
p50 / p90 / max over tokenrouter/ (by `ast`, a function's lines from its `def` to its last statement, nested
functions counted on their own too), the functions over 120 lines, and whether tests/test_layering.py passes.

    python3 bench/code_stats.py [--top 15]

Targets: no module over 600 lines; function p90 <= 25 lines; no function over 120 lines except GPU kernels.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tokenrouter"
MAX_MODULE_LINES = 600
MAX_P90 = 25
MAX_FUNCTION_LINES = 120


def functions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method in the file, nested ones included."""
    out: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                out.append((f"{prefix}{child.name}", child.end_lineno - first + 1))
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text(), str(path)), "")
    return out


def percentile(values: list[int], q: float) -> int:
    """The nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, -(-len(ordered) * q // 100) - 1))]


def is_kernel(path: Path, name: str) -> bool:
    """A GPU kernel: a function of a Triton kernel module (the target's exception)."""
    text = path.read_text()
    return "@triton.jit" in text and name.split(".")[0] in _jitted(text)


def _jitted(text: str) -> set[str]:
    tree = ast.parse(text)
    return {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
        and any("jit" in ast.unparse(d) or "autotune" in ast.unparse(d) for d in n.decorator_list)
    }


def layering_passes() -> bool:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "tests/test_layering.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return run.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=15, help="how many of the largest modules to list")
    args = parser.parse_args()
    files = sorted(PACKAGE.rglob("*.py"))
    sizes = sorted(((len(p.read_text().splitlines()), p.relative_to(ROOT)) for p in files), reverse=True)
    found = [(p, name, n) for p in files for name, n in functions(p)]
    lengths = [n for _, _, n in found]
    over = sorted(((n, p, name) for p, name, n in found if n > MAX_FUNCTION_LINES), reverse=True)

    print(f"modules: {len(files)}, {sum(n for n, _ in sizes):,} lines; over {MAX_MODULE_LINES} lines: "
          f"{sum(n > MAX_MODULE_LINES for n, _ in sizes)}")  # fmt: skip
    print(f"largest {args.top}:")
    for n, path in sizes[: args.top]:
        print(f"  {n:6,}  {path}{'  (over)' if n > MAX_MODULE_LINES else ''}")
    print(f"functions: {len(lengths):,}; lines p50 {percentile(lengths, 50)}, p90 {percentile(lengths, 90)} "
          f"(target <= {MAX_P90}), max {max(lengths)}")  # fmt: skip
    kernels = [t for t in over if is_kernel(t[1], t[2])]
    print(f"functions over {MAX_FUNCTION_LINES} lines: {len(over)} ({len(kernels)} of them GPU kernels)")
    for n, path, name in over:
        print(
            f"  {n:5}  {path.relative_to(ROOT)}:{name}{'  (GPU kernel)' if (n, path, name) in kernels else ''}"
        )
    print(f"layering test (tests/test_layering.py): {'passes' if layering_passes() else 'FAILS'}")


if __name__ == "__main__":
    main()
