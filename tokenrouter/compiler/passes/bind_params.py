"""Params: apply `-D NAME=VALUE` overrides (parsed by the param's type), evaluate defaults (literals and
other params), check each value against its declared type. Result: `program.params`."""

from __future__ import annotations

import re
from typing import Any

from tokenrouter.compiler.consteval import ConstError, evaluate, type_of
from tokenrouter.compiler.program import TYPES, Program, Unit
from tokenrouter.compiler.scope import dependencies_first, lookup, references
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, did_you_mean
from tokenrouter.dsl.limits import INT64_MAX, INT64_MIN

_FAILED = object()
MAX_CHAIN = 64  # params defined through one another, while one is being evaluated


def parse_define(type_name: str, raw: str) -> Any:
    """A `-D` value as the param's type; ValueError with a message when it does not parse."""
    text = raw.strip()
    if type_name == "int":
        return _parse_int(raw, text)
    if type_name == "float":
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"'{_short(raw)}' is not a float") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"'{_short(raw)}' is not a finite float")
        return value
    if type_name == "bool":
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"'{_short(raw)}' is not a bool (true or false)")
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return raw


def _parse_int(raw: str, text: str) -> int:
    if re.fullmatch(r"[+-]?\d+", text) and len(text.lstrip("+-").lstrip("0")) > len(str(INT64_MAX)):
        raise ValueError("beyond the 64-bit int range")
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"'{_short(raw)}' is not an int") from None
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError("beyond the 64-bit int range")
    return value


def _short(raw: str) -> str:
    return raw if len(raw) <= 40 else f"{raw[:24]}…{raw[-8:]} ({len(raw)} characters)"


def coerce(type_name: str, value: Any) -> Any:
    """`value` as `type_name` (an int is accepted for a float); ValueError when it is another type."""
    actual = type_of(value)
    if actual == type_name:
        return value
    if type_name == "float" and actual == "int":
        return float(value)
    raise ValueError(f"expected {type_name}, got {actual}")


def _canonical(program: Program, name: str) -> str:
    """A `-D` name as its param is keyed: a file imported more than once is one unit, named by its first import,
    and `-D` may name its params through any of its imports (`-D other_alias.NAME`)."""
    *aliases, last = name.split(".")
    unit = program.root
    for alias in aliases:
        unit = unit.imports.get(alias) if unit is not None else None
    return unit.prefix + last if unit is not None else name


def bind_params(program: Program) -> Program:
    diags: list[Diagnostic] = []
    decls: dict[str, tuple[Unit, ast.ParamDecl]] = {}
    for unit in program.units:
        for name, d in unit.table(ast.ParamDecl).items():
            decls[unit.prefix + name] = (unit, d)
    binder = _Binder(_overrides(program, decls, diags))
    uses = {}
    for key, (unit, d) in decls.items():
        refs = (lookup(unit, name) for name in references(d.value))
        uses[key] = [r.qualified for r in refs if r is not None and r.kind == "param"]
    for key in dependencies_first(uses):  # so that value_of recurses one param deep, but in a cycle
        unit, d = decls[key]
        try:
            binder.value_of(unit, d)
        except ConstError as e:
            if e.message:
                diags.append(unit.src.error(e.span, e.message))
    values = binder.values
    params = {key: {"type": d.type.name, "value": values[key]} for key, (_, d) in decls.items()}
    return program.with_(diags, params={k: p for k, p in params.items() if p["value"] is not _FAILED})


def _overrides(
    program: Program, decls: dict[str, tuple[Unit, ast.ParamDecl]], diags: list[Diagnostic]
) -> dict[str, Any]:
    """The `-D NAME=VALUE` values by param, parsed as the param's type; a diagnostic for each that names no
    param or does not parse."""
    overrides: dict[str, Any] = {}
    file = program.root.file if program.root else "<input>"
    for name, raw in program.defines.items():
        key = _canonical(program, name)
        if key not in decls:
            hint = did_you_mean(name, decls)
            diags.append(_define_error(file, name, raw, f"no param named '{name}'{hint}"))
            continue
        unit, d = decls[key]
        if d.type.name not in TYPES:
            continue
        try:
            overrides[key] = parse_define(d.type.name, raw)
        except ValueError as e:
            diags.append(_define_error(file, name, raw, f"{e} (param '{name}' is {d.type.name})"))
    return overrides


def _define_error(file: str, name: str, raw: str, problem: str) -> Diagnostic:
    """The error of a `-D NAME=VALUE` (no position: it is not in the file)."""
    return Diagnostic("error", file, 0, 0, f"-D {name}={_short(raw)}: {problem}")


class _Binder:
    """Each param's value (`values`: a failed one is `_FAILED`, reported once), evaluated on first use."""

    def __init__(self, overrides: dict[str, Any]) -> None:
        self.overrides = overrides
        self.values: dict[str, Any] = {}
        self.busy: set[str] = set()

    def value_of(self, unit: Unit, decl: ast.ParamDecl, use: ast.Span | None = None) -> Any:
        key = unit.prefix + decl.name.name
        if key in self.values:
            if self.values[key] is _FAILED:
                raise ConstError(use or decl.span, "")  # already reported
            return self.values[key]
        if key in self.busy:
            raise ConstError(decl.value.span, f"param '{key}' depends on itself")
        if len(self.busy) >= MAX_CHAIN:  # only a cycle gets here: the others are bound callees first
            raise ConstError(
                decl.value.span, f"param '{key}' is defined through more than {MAX_CHAIN} params"
            )
        self.busy.add(key)
        try:
            self.values[key] = self._evaluate(key, unit, decl)
            return self.values[key]
        except ConstError:
            self.values[key] = _FAILED
            raise
        finally:
            self.busy.discard(key)

    def _evaluate(self, key: str, unit: Unit, decl: ast.ParamDecl) -> Any:
        """The param's `-D` value, else its declared value coerced to its type."""
        if decl.type.name not in TYPES:
            hint = did_you_mean(decl.type.name, TYPES)
            raise ConstError(
                decl.type.span, f"unknown type '{decl.type.name}'; expected int, float, bool or str{hint}"
            )
        if key in self.overrides:
            return self.overrides[key]
        raw = evaluate(decl.value, unit, self.value_of)
        try:
            return coerce(decl.type.name, raw)
        except ValueError as e:
            raise ConstError(decl.value.span, f"param '{decl.name.name}' is {decl.type.name}: {e}") from None
