"""Load every imported file: `import "file.tr" [as x]` (relative to the importing file) and
`import stdlib.NAME`. Reports missing files, syntax errors in them, cycles and alias clashes."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.compiler.paths import file_problem, shown
from tokenrouter.compiler.program import Program, Unit
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, SourceMap, did_you_mean
from tokenrouter.dsl.parser import parse
from tokenrouter.dsl.source import read_source

STDLIB_DIR = Path(__file__).resolve().parents[2] / "stdlib"
MAX_DEPTH = 16


def stdlib_names() -> list[str]:
    return sorted(p.stem for p in STDLIB_DIR.glob("*.tr"))


def load_imports(program: Program) -> Program:
    if program.root is None:
        return program
    diags: list[Diagnostic] = []
    units: list[Unit] = [program.root]
    key = _key(program.root)
    _load(program.root, [key], {key: program.root}, units, diags)
    return program.with_(diags, units=tuple(units))


def _key(unit: Unit) -> str:
    return str(Path(unit.file).resolve())


def _alias(
    unit: Unit,
    decl: ast.ImportDecl,
    module: Unit,
    shown_as: str,
    imports: dict[str, Unit],
    diags: list[Diagnostic],
) -> str | None:
    """The name an import goes by (`as NAME`, else the imported policy's name); None (an error reported) where
    it has none or another import took it."""
    alias = decl.alias.name if decl.alias else _policy_name(module.module)
    if alias is None:
        diags.append(
            unit.src.error(decl.span, f"{shown_as} has no `policy NAME` line; write `import ... as NAME`")
        )
        return None
    if alias in imports:
        diags.append(unit.src.error(decl.span, f"import name '{alias}' is already used by another import"))
        return None
    return alias


def _load(
    unit: Unit, stack: list[str], loaded: dict[str, Unit | str], units: list[Unit], diags: list[Diagnostic]
) -> None:
    """Load `unit`'s imports, each file once: `loaded` maps a resolved path to its unit (or to why it could not
    be loaded, its own errors reported then), so that a file imported again (under another name, by another
    file) is the same unit, whose params, fns and routers keep the name of the first import that reached it."""
    imports: dict[str, Unit] = {}
    import_decls: dict[str, ast.ImportDecl] = {}
    for decl in unit.decls(ast.ImportDecl):
        found = _imported(unit, decl, stack, loaded, diags)
        if found is None:
            continue
        key, module, shown_as = found
        alias = _alias(unit, decl, module, shown_as, imports, diags)
        if alias is None:
            continue
        if not module.prefix:  # its first import: it takes this import's name
            module.prefix = f"{unit.prefix}{alias}."
            units.append(module)
            _load(module, stack + [key], loaded, units, diags)
        imports[alias] = module
        import_decls[alias] = decl
    unit.imports = imports
    unit.import_decls = import_decls


def _imported(
    unit: Unit, decl: ast.ImportDecl, stack: list[str], loaded: dict[str, Unit | str], diags: list[Diagnostic]
) -> tuple[str, Unit, str] | None:
    """(resolved path, unit, path as shown) of the file `decl` imports, read once; None, reported, where it cannot be had (no
    such file, a cycle, too deep, unreadable)."""
    target = _target(unit, decl, diags)
    if target is None:
        return None
    key = str(target.resolve())
    if key in stack:
        chain = " → ".join(Path(k).name for k in stack[stack.index(key) :] + [key])
        diags.append(unit.src.error(decl.span, f"import cycle: {chain}"))
        return None
    if len(stack) >= MAX_DEPTH:
        diags.append(unit.src.error(decl.span, f"imports nested deeper than {MAX_DEPTH} files"))
        return None
    shown_as = shown(target)
    if key not in loaded:
        loaded[key] = _read(target, shown_as, diags)
    module = loaded[key]
    if isinstance(module, str):
        diags.append(unit.src.error(decl.span, module))
        return None
    return key, module, shown_as


def _read(target: Path, shown_as: str, diags: list[Diagnostic]) -> Unit | str:
    """The unit of an imported file, its prefix not yet set; or (its diagnostics reported) why it cannot load."""
    text, problem = read_source(target, shown_as)
    if text is None:
        assert problem is not None
        diags.append(problem)
        return f"cannot read imported file {shown_as}"
    result = parse(text, shown_as)
    if result.module is None:
        diags.extend(result.diagnostics)
        return f"imported file {shown_as} has syntax errors"
    return Unit(file=shown_as, dir=target.resolve().parent, text=text, module=result.module,
                src=SourceMap(shown_as, text), prefix="")  # fmt: skip


def _target(unit: Unit, decl: ast.ImportDecl, diags: list[Diagnostic]) -> Path | None:
    if decl.stdlib is not None:
        path = STDLIB_DIR / f"{decl.stdlib}.tr"
        if not path.is_file():
            hint = did_you_mean(decl.stdlib, stdlib_names())
            diags.append(unit.src.error(decl.span, f"no stdlib policy named '{decl.stdlib}'{hint}"))
            return None
        return path
    assert decl.path is not None
    if not decl.path.endswith(".tr"):
        diags.append(unit.src.error(decl.span, f'an imported file must end in .tr: "{decl.path}"'))
        return None
    path = unit.dir / decl.path
    problem = file_problem(path)
    if problem == "no such file":
        diags.append(unit.src.error(decl.span, f"imported file not found: {shown(path)}"))
        return None
    if problem is not None:
        diags.append(unit.src.error(decl.span, f"cannot import {shown(path)}: {problem}"))
        return None
    return path


def _policy_name(module: ast.Module) -> str | None:
    for d in module.decls:
        if isinstance(d, ast.PolicyDecl):
            return d.name.name
    return None
