"""Validation of one route IR (docs/ir.md, "A route IR") before any code is rendered from it.

A plan may come from someone else, so nothing in it is trusted: every op must be in the closed set, every
name a plain identifier, every constant a number or bool, and `args` must point at earlier nodes. The
renderers only ever see a `RouteSpec` built here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tokenrouter.compiler.program import FEATURES  # the feature vocabulary, one definition

ARITY: dict[str, int] = {
    "const": 0,
    "feature": 0,
    "router": 0,
    "uniform": 0,
    "add": 2,
    "sub": 2,
    "mul": 2,
    "div": 2,
    "neg": 1,
    "lt": 2,
    "le": 2,
    "gt": 2,
    "ge": 2,
    "eq": 2,
    "ne": 2,
    "and": 2,
    "or": 2,
    "not": 1,
    "min": 2,
    "max": 2,
    "abs": 1,
    "log": 1,
    "exp": 1,
    "sigmoid": 1,
}
TYPES = ("int", "float", "bool")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class RouteIRError(ValueError):
    """A route IR outside the contract of docs/ir.md. The message names the model and the node."""


@dataclass(slots=True, frozen=True)
class Node:
    index: int
    op: str
    type: str
    args: tuple[int, ...] = ()
    value: float | int | bool | None = None  # const
    name: str | None = None  # feature / router


@dataclass(slots=True, frozen=True)
class Rule:
    index: int
    cond: int | None
    comment: str  # printable ASCII only, safe inside a `#` comment


@dataclass(slots=True, frozen=True)
class RouteSpec:
    """The checked route IR of one model: what a renderer may turn into code."""

    model: str
    features: tuple[str, ...]
    routers: tuple[str, ...]
    uses_uniform: bool
    nodes: tuple[Node, ...]
    rules: tuple[Rule, ...]

    @property
    def needs_margin(self) -> bool:
        return "margin" in self.features

    @property
    def needs_entropy(self) -> bool:
        return "entropy" in self.features or "norm_entropy" in self.features


def _safe_comment(text: str) -> str:
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:200]


def _fail(model: str, where: str, msg: str) -> RouteIRError:
    return RouteIRError(f"route IR of model {model!r}, {where}: {msg}")


def check_route_ir(ir: dict, model: str | None = None) -> RouteSpec:
    """Check `ir` against docs/ir.md and return it as a RouteSpec; raise RouteIRError otherwise."""
    if not isinstance(ir, dict):
        raise RouteIRError(f"route IR must be a JSON object, got {type(ir).__name__}")
    model = model if model is not None else ir.get("model")
    if not isinstance(model, str) or not _NAME.match(model):
        raise RouteIRError(f"route IR has no valid 'model' name: {model!r}")
    raw_nodes = ir.get("nodes", [])
    raw_rules = ir.get("rules", [])
    if not isinstance(raw_nodes, list) or not isinstance(raw_rules, list):
        raise _fail(model, "top level", "'nodes' and 'rules' must be lists")
    routers = ir.get("routers", [])
    if not isinstance(routers, list) or not all(isinstance(r, str) and _NAME.match(r) for r in routers):
        raise _fail(model, "'routers'", f"must be a list of names, got {routers!r}")
    used: dict = {"features": set(), "uniform": False}
    nodes = [_node(model, i, raw, routers, used) for i, raw in enumerate(raw_nodes)]
    _check_types(model, nodes)
    rules = [_rule(model, j, raw, len(raw_rules), nodes) for j, raw in enumerate(raw_rules)]
    features = _declared_features(model, ir, used["features"])
    uses_uniform = used["uniform"]
    if bool(ir.get("uses_uniform", uses_uniform)) != uses_uniform:
        raise _fail(
            model, "'uses_uniform'", f"says {ir.get('uses_uniform')!r} but the nodes say {uses_uniform}"
        )
    return RouteSpec(model, tuple(sorted(features)), tuple(routers), uses_uniform, tuple(nodes), tuple(rules))


def _node(model: str, i: int, raw: Any, routers: list[str], used: dict) -> Node:
    """Node `i` checked (its op, type, args, and a leaf's value or name); the features it reads and whether it
    is uniform() are noted in `used`."""
    where = f"node {i}"
    if not isinstance(raw, dict):
        raise _fail(model, where, "must be an object")
    op, typ = raw.get("op"), raw.get("type")
    if op not in ARITY:
        raise _fail(model, where, f"unknown op {op!r} (the closed set is in docs/ir.md)")
    if typ not in TYPES:
        raise _fail(model, where, f"type must be one of {', '.join(TYPES)}, got {typ!r}")
    args = raw.get("args", [])
    if not isinstance(args, list) or len(args) != ARITY[op]:
        raise _fail(model, where, f"op {op!r} takes {ARITY[op]} args, got {args!r}")
    for a in args:
        if not isinstance(a, int) or isinstance(a, bool) or not 0 <= a < i:
            raise _fail(model, where, f"arg {a!r} is not the index of an earlier node")
    value, name = _leaf_value(model, where, raw, op, typ, routers, used)
    return Node(i, op, typ, tuple(args), value, name)


def _leaf_value(
    model: str, where: str, raw: dict, op: str, typ: str, routers: list[str], used: dict
) -> tuple:
    """A node's (value, name): a const's value, a feature's or router's name, checked against its type."""
    value = name = None
    if op == "const":
        value = _const_value(model, where, raw.get("value"), typ)
    elif op == "feature":
        name = raw.get("name")
        if name not in FEATURES:
            raise _fail(model, where, f"unknown feature {name!r}; known: {', '.join(FEATURES)}")
        if FEATURES[name] != typ:
            raise _fail(model, where, f"feature {name!r} has type {FEATURES[name]}, not {typ}")
        used["features"].add(name)
    elif op == "router":
        name = raw.get("name")
        if name not in routers:
            raise _fail(model, where, f"router {name!r} is not listed in 'routers' {routers!r}")
        if typ != "float":
            raise _fail(model, where, "a router's output is a float")
    elif op == "uniform":
        used["uniform"] = True
        if typ != "float":
            raise _fail(model, where, "uniform() is a float")
    return value, name


def _const_value(model: str, where: str, value: Any, typ: str) -> Any:
    """A constant's value, checked against its type (an int constant of type float becomes a float)."""
    if isinstance(value, bool):
        if typ != "bool":
            raise _fail(model, where, f"bool constant with type {typ!r}")
    elif isinstance(value, int):
        if typ == "bool" or not -(2**63) <= value < 2**63:
            raise _fail(model, where, f"int constant {value!r} does not fit type {typ!r}")
        if typ == "float":
            value = float(value)
    elif isinstance(value, float):
        if typ != "float" or not math.isfinite(value):
            raise _fail(model, where, f"float constant {value!r} with type {typ!r}")
    else:
        raise _fail(model, where, f"constant must be a number or bool, got {value!r}")
    return value


def _rule(model: str, j: int, raw: Any, count: int, nodes: list[Node]) -> Rule:
    """Rule `j` of `count`: its condition a bool node (or none, for the last one), its source as a comment."""
    where = f"rule {j}"
    if not isinstance(raw, dict):
        raise _fail(model, where, "must be an object")
    cond = raw.get("cond")
    if cond is None:
        if j != count - 1:
            raise _fail(model, where, "an unconditional rule must be the last one")
    elif not isinstance(cond, int) or isinstance(cond, bool) or not 0 <= cond < len(nodes):
        raise _fail(model, where, f"cond {cond!r} is not a node index")
    elif nodes[cond].type != "bool":
        raise _fail(model, where, f"cond node {cond} has type {nodes[cond].type}, not bool")
    text = raw.get("source") or ""
    line = raw.get("line")
    comment = _safe_comment(f"{text} (line {line})" if isinstance(line, int) else str(text))
    return Rule(j, cond, comment)


def _declared_features(model: str, ir: dict, used: set[str]) -> list[str]:
    """The IR's `features` (the ones the nodes read where absent): known names, and every one the nodes read."""
    features = ir.get("features", sorted(used))
    if not isinstance(features, list) or any(f not in FEATURES for f in features):
        raise _fail(model, "'features'", f"must list names from {', '.join(FEATURES)}, got {features!r}")
    missing = used - set(features)
    if missing:
        raise _fail(model, "'features'", f"nodes read {sorted(missing)} but 'features' does not list them")
    return features


_NUMERIC_RESULT = {"add", "sub", "mul", "neg", "min", "max", "abs"}


def _check_types(model: str, nodes: list[Node]) -> None:
    for n in nodes:
        arg_types = [nodes[a].type for a in n.args]
        where = f"node {n.index} ({n.op})"
        if n.op in _NUMERIC_RESULT:
            if "bool" in arg_types:
                raise _fail(model, where, "arithmetic on a bool")
            want = "float" if "float" in arg_types else "int"
            if n.type != want:
                raise _fail(model, where, f"result type is {want}, IR says {n.type}")
        elif n.op in ("div", "log", "exp", "sigmoid"):
            if "bool" in arg_types or n.type != "float":
                raise _fail(model, where, "takes numbers and gives a float")
        elif n.op in ("lt", "le", "gt", "ge", "eq", "ne"):
            numeric = all(t != "bool" for t in arg_types)
            both_bool = all(t == "bool" for t in arg_types)
            if n.type != "bool" or not (numeric or (both_bool and n.op in ("eq", "ne"))):
                raise _fail(model, where, f"cannot compare {arg_types}")
        elif n.op in ("and", "or", "not"):
            if n.type != "bool" or any(t != "bool" for t in arg_types):
                raise _fail(model, where, "logical ops take and give bool")


def operand_type(spec: RouteSpec, node: Node) -> str:
    """The type both operands are converted to before `node` is computed (int, float or bool)."""
    arg_types = [spec.nodes[a].type for a in node.args]
    if node.op in ("div", "log", "exp", "sigmoid"):
        return "float"
    if "float" in arg_types:
        return "float"
    if arg_types and all(t == "bool" for t in arg_types):
        return "bool"
    return "int"
