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
    """Every name declared in `unit`: name -> (kind, first declaration). Kept on the unit (do not change it):
    every name lookup asks, and a file may declare hundreds of names."""
    cached = unit.names
    if cached is not None and cached[0] is unit.imports:
        return cached[1]
    out: dict[str, tuple[str, Any]] = {}
    for kind, cls in (("param", ast.ParamDecl), ("fn", ast.FnDecl), ("router", ast.RouterDecl),
                      ("model", ast.ModelDecl)):  # fmt: skip
        for d in unit.decls(cls):
            out.setdefault(d.name.name, (kind, d))
    for alias in unit.imports:
        out.setdefault(alias, ("import", unit.imports[alias]))
    unit.names = (unit.imports, out)
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


def references(e: ast.Expr) -> list[ast.Name]:
    """Every name in an expression, called ones included (its syntax is at most dsl.parser.MAX_DEPTH deep)."""
    match e:
        case ast.Name():
            return [e]
        case ast.Call(func=f, args=args):
            return [f] + [n for a in args for n in references(a)]
        case ast.Unary(operand=x):
            return references(x)
        case ast.Binary(left=lhs, right=rhs):
            return references(lhs) + references(rhs)
        case ast.In(left=lhs, items=items):
            return references(lhs) + references(items)
        case ast.ListExpr(items=items):
            return [n for i in items for n in references(i)]
    return []


def dependencies_first(deps: dict[str, list[str]]) -> list[str]:
    """The keys of `deps` (key -> the keys it uses), each after those it uses; the members of a cycle in some
    order. Found without recursion: a chain of fns or params may be long."""
    order: list[str] = []
    seen: set[str] = set()
    for first in deps:
        if first in seen:
            continue
        seen.add(first)
        stack = [(first, iter(deps[first]))]
        while stack:
            key, todo = stack[-1]
            used = next((k for k in todo if k not in seen and k in deps), None)
            if used is None:
                order.append(stack.pop()[0])
            else:
                seen.add(used)
                stack.append((used, iter(deps[used])))
    return order
