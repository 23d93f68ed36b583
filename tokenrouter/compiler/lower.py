"""Lowering: typed rules (`TExpr` trees) → the route IR of docs/ir.md, an expression DAG in topological
order with common sub-expressions shared, per model."""

from __future__ import annotations

from typing import Any

from tokenrouter.compiler.program import Program, TExpr, TypedRule
from tokenrouter.dsl.formatter import format_rule


def _json_value(t: TExpr) -> Any:
    if t.type == "float":
        return float(t.value)
    if t.type == "int":
        return int(t.value)
    return bool(t.value)


class _Dag:
    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.index: dict[tuple, int] = {}
        self.added: dict[int, int] = {}  # id(TExpr) -> its node; the TExprs live in the program throughout
        self.features: set[str] = set()
        self.routers: set[str] = set()
        self.uses_uniform = False

    def add(self, root: TExpr) -> int:
        """The node of `root`, added with its arguments first. Without recursion, and each `TExpr` object once:
        an inlined fn argument is one object however often the body uses it, and however deep the nesting."""
        stack = [(root, False)]
        while stack:
            t, args_done = stack.pop()
            if id(t) in self.added:
                continue
            if args_done:
                self.added[id(t)] = self._node(t, tuple(self.added[id(a)] for a in t.args))
            else:
                stack.append((t, True))
                stack.extend((a, False) for a in reversed(t.args))
        return self.added[id(root)]

    def _node(self, t: TExpr, args: tuple[int, ...]) -> int:
        value = _json_value(t) if t.op == "const" else None
        key = (t.op, t.type, args, t.name, repr(value) if t.op == "const" else None)
        if key in self.index:
            return self.index[key]
        node: dict[str, Any] = {"op": t.op}
        if t.op == "const":
            node["value"] = value
        elif t.op in ("feature", "router"):
            node["name"] = t.name
            (self.features if t.op == "feature" else self.routers).add(t.name)
        elif t.op == "uniform":
            self.uses_uniform = True
        else:
            node["args"] = list(args)
        node["type"] = t.type
        self.nodes.append(node)
        self.index[key] = len(self.nodes) - 1
        return self.index[key]


def lower_route(model: str, rules: tuple[TypedRule, ...]) -> dict[str, Any]:
    dag = _Dag()
    ir_rules = []
    for r in rules:
        cond = dag.add(r.cond) if r.cond is not None else None
        ir_rules.append(
            {
                "cond": cond,
                "target": r.target,
                "drop": r.drop,
                "for": r.for_k,
                "source": format_rule(r.rule),
                "line": r.rule.span.line,
            }
        )
    return {
        "model": model,
        "features": sorted(dag.features),
        "routers": sorted(dag.routers),
        "uses_uniform": dag.uses_uniform,
        "nodes": dag.nodes,
        "rules": ir_rules,
    }


def lower(program: Program) -> dict[str, dict[str, Any]]:
    """The `routes` section of a plan: every model, in declaration order."""
    return {m: lower_route(m, program.routes.get(m, ())) for m in program.models}
