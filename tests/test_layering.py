"""The package's layering (docs/architecture.md): the compiler imports neither the runtime nor the throughput
model, the runtime never imports the throughput model, and no import cycle exists among tokenrouter's modules.

Imports are read with `ast`, function-level imports included, and cycles are counted over all of them: an
import inside a function still ties its module to the other one, and the cycles this test was written against
ran only through such imports. `from pkg import name` counts as an import of `pkg.name` where that is a module,
else of `pkg`; importing a module does not count as importing the packages above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (the importing package, the packages it must not import)
FORBIDDEN = (
    ("tokenrouter.compiler", ("tokenrouter.runtime", "tokenrouter.throughput")),
    ("tokenrouter.runtime", ("tokenrouter.throughput",)),
)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the tokenrouter package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / "tokenrouter").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The tokenrouter modules that module `name` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {_resolve(t, known) for t in targets if t == "tokenrouter" or t.startswith("tokenrouter.")}
    out.discard(None)
    out.discard(name)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    def inside(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return [
        f"{name} imports {target}"
        for name, targets in sorted(graph.items())
        for layer, banned in FORBIDDEN
        if inside(name, layer)
        for target in sorted(targets)
        if any(inside(target, b) for b in banned)
    ]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next((w for w in edges if w not in index or w in on_stack), None)
            if nxt is not None:
                if nxt in index:
                    low[node] = min(low[node], index[nxt])
                else:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_layer_imports_one_above_it():
    assert forbidden_imports(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_checks_see_function_level_imports_and_cycles(tmp_path):
    pkg = tmp_path / "tokenrouter"
    for folder in ("compiler", "runtime", "throughput"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "compiler" / "a.py").write_text("def f():\n    from tokenrouter.runtime import b\n")
    (pkg / "runtime" / "b.py").write_text("from ..throughput.c import x\n")
    (pkg / "throughput" / "c.py").write_text("def g():\n    from tokenrouter.compiler import a\nx = 1\n")
    graph = import_graph(tmp_path)
    assert forbidden_imports(graph) == [
        "tokenrouter.compiler.a imports tokenrouter.runtime.b",
        "tokenrouter.runtime.b imports tokenrouter.throughput.c",
    ]
    assert cycles(graph) == [["tokenrouter.compiler.a", "tokenrouter.runtime.b", "tokenrouter.throughput.c"]]


def test_the_frontend_and_the_cli_start_without_torch():
    """The HTTP frontend's process and the CLI's entry never import torch (a second or more at every start, and
    memory in a process that runs no model): what they need of the engine's side is imported where it is used."""
    import subprocess
    import sys

    code = (
        "import sys; import tokenrouter.cli, tokenrouter.runtime.frontend.process, tokenrouter.runtime.frontend.app; "
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
