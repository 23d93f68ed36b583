"""The compiler driver: parse, run `PASSES` in order, lower, assemble the plan (docs/ir.md)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenrouter.compiler.lower import lower
from tokenrouter.compiler.passes.bind_params import bind_params
from tokenrouter.compiler.passes.check_feasibility import check_feasibility
from tokenrouter.compiler.passes.check_options import check_options
from tokenrouter.compiler.passes.check_placement import check_placement
from tokenrouter.compiler.passes.check_progress import check_progress
from tokenrouter.compiler.passes.check_reachability import check_reachability
from tokenrouter.compiler.passes.check_routers import check_routers
from tokenrouter.compiler.passes.check_rules import check_rules
from tokenrouter.compiler.passes.check_types import check_types
from tokenrouter.compiler.passes.check_vocab import check_vocab
from tokenrouter.compiler.passes.load_imports import load_imports
from tokenrouter.compiler.passes.resolve_names import resolve_names
from tokenrouter.compiler.paths import file_problem
from tokenrouter.compiler.plan import PlanError, validate_plan
from tokenrouter.compiler.program import Program, Unit
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, SourceMap, sort_key
from tokenrouter.dsl.parser import parse
from tokenrouter.dsl.source import read_source

PLAN_FORMAT = "tokenrouter.plan/1"

PASSES = (
    load_imports,
    resolve_names,
    bind_params,
    check_options,
    check_placement,
    check_vocab,
    check_types,
    check_rules,
    check_reachability,
    check_progress,
    check_feasibility,
    check_routers,
)


@dataclass(slots=True)
class CompileResult:
    plan: dict[str, Any] | None  # None when there are errors
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    @property
    def ok(self) -> bool:
        return self.plan is not None


def compile_source(
    text: str, file: str, defines: dict[str, str] | None = None, weights_check: bool = True
) -> CompileResult:
    """Compile .tr source text; `file` names it in diagnostics and anchors its relative paths.
    `weights_check`: a model folder or router file missing on this machine is an error (False: a warning,
    for compiling where the weights are not)."""
    parsed = parse(text, file)
    if parsed.module is None:
        return CompileResult(None, _tidy(parsed.diagnostics))
    root = Unit(file=file, dir=Path(file).resolve().parent, text=text, module=parsed.module,
                src=SourceMap(file, text), prefix="")  # fmt: skip
    program = Program(root=root, defines=dict(defines or {}), weights_check=weights_check)
    for compiler_pass in PASSES:
        program = compiler_pass(program)
    diagnostics = _tidy(list(program.diagnostics))
    if program.has_errors:
        return CompileResult(None, diagnostics)
    plan = _plan(program, text, file)
    try:  # the check that `compile` makes before it writes: `check` accepts exactly what `compile` writes
        validate_plan(plan, file)
    except PlanError as e:
        bug = f"internal error (please report it): the compiled plan fails its check: {e}"
        return CompileResult(None, [*diagnostics, Diagnostic("error", file, 0, 0, bug)])
    return CompileResult(plan, diagnostics)


def compile_file(
    path: str | Path, defines: dict[str, str] | None = None, weights_check: bool = True
) -> CompileResult:
    """Compile a .tr file. A file that cannot be read is a diagnostic, not an exception."""
    p = Path(path)
    problem = file_problem(p)
    if problem is not None:
        return CompileResult(None, [Diagnostic("error", str(path), 0, 0, problem)])
    text, problem_at = read_source(p, str(path))
    if text is None:
        assert problem_at is not None
        return CompileResult(None, [problem_at])
    return compile_source(text, str(path), defines, weights_check)


def _tidy(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """Drop exact repeats (an error in an inlined fn shows once), sort by place."""
    seen = set()
    out = []
    for d in diagnostics:
        key = (d.severity, d.file, d.line, d.col, d.message)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return sorted(out, key=sort_key)


def _plan(program: Program, text: str, file: str) -> dict[str, Any]:
    root = program.root
    assert root is not None
    policy = root.decls(ast.PolicyDecl)[0]
    root_params = {k: v for k, v in program.params.items()}
    routers = {
        name: {k: v for k, v in r.items() if not k.startswith("_")} for name, r in program.routers.items()
    }
    return {
        "format": PLAN_FORMAT,
        "policy": {"name": policy.name.name, "description": policy.description},
        "source": {"path": file, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "text": text},
        "params": root_params,
        "models": program.models,
        "entry": program.entry,
        "serve": program.serve,
        "routers": routers,
        "routes": lower(program),
        "checks": {
            "feasibility": program.checks.get("feasibility"),
            "progress": program.checks.get("progress", {"ok": True}),
        },
    }


def load_plan(
    path: str | Path, defines: dict[str, str] | None = None, weights_check: bool = True
) -> dict[str, Any]:
    """The plan behind a command-line argument: a `.tr` policy compiled now (with `-D` `defines`, and
    `weights_check` as `compile_source` takes it), or a plan file written by `compile` (read and validated). Raises `PlanError` with a message for users: for a policy
    that does not compile, its rendered diagnostics."""
    from tokenrouter.compiler.plan import read_plan
    from tokenrouter.dsl.diagnostics import render_all

    p = Path(path)
    if p.suffix == ".tr":
        problem = file_problem(p)
        if problem is not None:
            raise PlanError(f"{p}: {problem}")
        result = compile_file(p, defines or {}, weights_check)
        if result.plan is None:
            # callers print "error: " before the message: the summary line first, then each diagnostic once
            n = len(result.errors)
            raise PlanError(
                f"{p}: not compiled ({n} error{'s' * (n != 1)}):\n{render_all(result.diagnostics).rstrip()}"
            )
        return result.plan
    if defines:
        raise PlanError("-D applies to a .tr policy; a plan's params are already bound")
    return read_plan(p)
