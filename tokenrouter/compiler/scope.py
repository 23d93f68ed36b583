"""Name lookup shared by the passes: what a `Name` in some unit refers to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenrouter.compiler.program import FEATURES, Unit
from tokenrouter.dsl import ast

BUILTINS = {"min": (2, None), "max": (2, None), "abs": (1, 1), "log": (1, 1), "exp": (1, 1),
            "sigmoid": (1, 1), "uniform": (0, 0)}  # fmt: skip
ROUTER_KINDS = ("linear", "mlp")
ROUTER_INPUTS = ("hidden", "topk_logits", "topk_logprobs", "embedding")


@dataclass(frozen=True, slots=True)
class Ref:
    kind: str  # param | fn | router | model | feature | local | import
    unit: Unit
    name: str
    decl: Any = None

    @property
    def qualified(self) -> str:
        return self.unit.prefix + self.name


def unit_names(unit: Unit) -> dict[str, tuple[str, Any]]:
    """Every name declared in `unit`: name -> (kind, first declaration)."""
    out: dict[str, tuple[str, Any]] = {}
    for kind, cls in (("param", ast.ParamDecl), ("fn", ast.FnDecl), ("router", ast.RouterDecl),
                      ("model", ast.ModelDecl)):  # fmt: skip
        for d in unit.decls(cls):
            out.setdefault(d.name.name, (kind, d))
    for alias in unit.imports:
        out.setdefault(alias, ("import", unit.imports[alias]))
    return out


def lookup(unit: Unit, name: ast.Name, locals_: dict[str, Any] | None = None) -> Ref | None:
    """Resolve `name` as seen from `unit` (fn arguments in `locals_` first); None when unknown."""
    if len(name.parts) == 1:
        n = name.parts[0]
        if locals_ and n in locals_:
            return Ref("local", unit, n, locals_[n])
        found = unit_names(unit).get(n)
        if found is not None:
            kind, decl = found
            return Ref(kind, unit, n, decl)
        if n in FEATURES:
            return Ref("feature", unit, n)
        return None
    alias, n = name.parts[0], name.parts[1]
    other = unit.imports.get(alias)
    if other is None:
        return None
    found = unit_names(other).get(n)
    if found is None or found[0] not in ("param", "fn", "router"):
        return None
    return Ref(found[0], other, n, found[1])


def visible(unit: Unit, locals_: dict[str, Any] | None = None) -> list[str]:
    """Names a user could have meant, for "did you mean"."""
    names = list(unit_names(unit)) + list(FEATURES) + list(BUILTINS) + list(locals_ or {})
    for alias, other in unit.imports.items():
        names += [f"{alias}.{n}" for n, (k, _) in unit_names(other).items() if k in ("param", "fn", "router")]
    return names


def plan_router_name(ref: Ref) -> str:
    """Routers of imported files are named `ALIAS__NAME` in the plan (see docs/ir.md)."""
    return ref.unit.prefix.replace(".", "__") + ref.name
