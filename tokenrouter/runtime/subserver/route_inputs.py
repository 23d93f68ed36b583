"""The route decision's inputs, for the requests that ask (`SamplingSpec.route_inputs`): what the model's route
expression read at each step (its features, `uniform`, its routers' scores: `RouteResult.features`), per row as
`{name: value}`, sent with the token it decided on (`TokenOut.route_inputs`). Nothing of it is computed for a
step none of whose rows asks, nor for a model with no route block (it reads nothing). `rule_texts` writes a
model's rules with their constants (a threshold as its value), for a reader of those inputs (the playground)."""

from __future__ import annotations

import torch

from tokenrouter.runtime.subserver.req import Req


def wanted(rows: list[Req]) -> bool:
    """Whether the route kernel should report its features for this step."""
    return any(r.sampling.route_inputs for r in rows)


def note_route_inputs(rows: list[Req], features: dict[str, torch.Tensor] | None) -> None:
    """Keep on each row that asks its decision's inputs (None on the others, and where there are none)."""
    for r in rows:
        r.route_inputs = None
    if not features:
        return
    values = {name: t.float().tolist() for name, t in features.items()}  # one copy per input, asked for only
    for i, r in enumerate(rows):
        if r.sampling.route_inputs:
            r.route_inputs = {name: v[i] for name, v in values.items()}


def token_inputs(req: Req) -> list[dict[str, float]] | None:
    """The `route_inputs` of the TokenOut of this step's decision on `req`."""
    return None if req.route_inputs is None else [req.route_inputs]


_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
          "eq": "==", "ne": "!=", "and": "and", "or": "or"}  # fmt: skip


def rule_texts(route: dict) -> list[str]:
    """A model's route IR (docs/ir.md) rule by rule as text, constants folded in: `when norm_entropy > 0.3 ->
    llm drop` (a `fn` call and a param appear as what they compute)."""
    nodes = route.get("nodes") or []
    out = []
    for rule in route.get("rules") or []:
        cond = "always" if rule.get("cond") is None else f"when {_node_text(nodes, rule['cond'], top=True)}"
        out.append(f"{cond} -> {rule['target']}" + (" drop" if rule.get("drop") else "")
                   + (f" for {rule['for']}" if rule.get("for") else ""))  # fmt: skip
    return out


def _node_text(nodes: list[dict], i: int, top: bool = False) -> str:
    """Node i of a route IR as source text (an infix operation in parentheses unless it is the `top` one)."""
    n = nodes[i]
    op, args = n["op"], [_node_text(nodes, a) for a in n.get("args", ())]
    if op == "const":
        v = n["value"]
        out = str(v).lower() if isinstance(v, bool) else f"{v:g}"
    elif op in ("feature", "router"):
        out = n["name"]
    elif op == "uniform":
        out = "uniform()"
    elif op in _INFIX:
        out = f"{args[0]} {_INFIX[op]} {args[1]}"
        return out if top else f"({out})"
    elif op == "neg":
        out = f"-{args[0]}"
    elif op == "not":
        out = f"not {args[0]}"
    else:  # min, max, abs, log, exp, sigmoid
        out = f"{op}({', '.join(args)})"
    return out
