"""The state a compilation threads through its passes.

`Program` is frozen: every pass is a function `Program -> Program` that returns a copy with the fields it
computes filled in and its diagnostics appended (see `driver.PASSES`). Passes never raise for a user's
mistake; where earlier errors leave a piece undefined they skip that piece.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, SourceMap

FEATURES = {
    "token": "int",
    "logprob": "float",
    "confidence": "float",
    "margin": "float",
    "entropy": "float",
    "norm_entropy": "float",
    "run_length": "int",
    "generated": "int",
    "position": "int",
}
TYPES = ("int", "float", "bool", "str")


@dataclass(slots=True)
class Unit:
    """One source file taking part in a compilation: the root or an imported file."""

    file: str  # as shown in diagnostics
    dir: Path  # relative paths in this file are relative to it
    text: str
    module: ast.Module
    src: SourceMap
    prefix: str  # "" for the root, "alias." (or "a.b.") for an imported file
    imports: dict[str, Unit] = field(default_factory=dict)  # alias -> unit
    import_decls: dict[str, ast.ImportDecl] = field(default_factory=dict)  # alias -> its import
    names: tuple[dict, dict] | None = field(
        default=None, repr=False, compare=False
    )  # scope.unit_names' cache

    def decls(self, kind: type) -> list[Any]:
        return [d for d in self.module.decls if isinstance(d, kind)]

    def table(self, kind: type) -> dict[str, Any]:
        """name -> first declaration of that kind (duplicates are reported by resolve_names)."""
        out: dict[str, Any] = {}
        for d in self.decls(kind):
            out.setdefault(d.name.name, d)
        return out


@dataclass(frozen=True, slots=True)
class TExpr:
    """A typed, inlined expression: exactly an IR node, with children instead of indices."""

    op: str
    type: str  # int | float | bool | str | error
    args: tuple[TExpr, ...] = ()
    value: Any = None  # const
    name: str | None = None  # feature / router


@dataclass(frozen=True, slots=True)
class TypedRule:
    cond: TExpr | None
    target: str
    drop: bool
    for_k: int | None
    rule: ast.Rule


@dataclass(frozen=True, slots=True)
class Program:
    root: Unit | None
    defines: dict[str, str]
    diagnostics: tuple[Diagnostic, ...] = ()
    weights_check: bool = True  # a missing model folder or router file is an error (False: a warning)
    units: tuple[Unit, ...] = ()  # every unit, root first (set by load_imports)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # qualified name -> {type, value}
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # plan "models" entries
    model_decls: dict[str, ast.ModelDecl] = field(default_factory=dict)
    serve: dict[str, Any] = field(default_factory=dict)
    entry: str | None = None
    routers: dict[str, dict[str, Any]] = field(default_factory=dict)  # plan "routers" entries
    routes: dict[str, tuple[TypedRule, ...]] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)

    def with_(self, diagnostics: list[Diagnostic] | tuple[Diagnostic, ...] = (), **changes: Any) -> Program:
        return dataclasses.replace(self, diagnostics=self.diagnostics + tuple(diagnostics), **changes)

    @property
    def has_errors(self) -> bool:
        return any(d.is_error for d in self.diagnostics)
