"""What `train-router` and `eval` need to know about a plan: load it, check that teacher forcing can
evaluate it, find the threshold param inside the entry model's route IR, and evaluate route IR over arrays.

Teacher-forced evaluation supports the policy shape of CITER and R2R: every rule of the entry model's
route block hands over with ``drop`` to a model that writes exactly one token and comes back (``for 1``,
or a route block that is just ``-> ENTRY``). Then each position of a text is written either by the entry
model or by the fired rule's target, independently of the other positions. Other shapes are refused
with a message (their teacher-forced meaning depends on the tokens they would have generated).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


class PolicyViewError(ValueError):
    """A plan that train-router / eval cannot work with. The message is for users."""


def load_plan(path: str | Path, defines: dict[str, str] | None = None, weights_check: bool = True) -> dict:
    """A plan from a ``.tr`` source (compiled now, `weights_check` as ``compile_source`` takes it) or a plan
    file written by ``tokenrouter compile``."""
    from tokenrouter.compiler.driver import load_plan as load
    from tokenrouter.compiler.plan import PlanError

    try:
        return load(path, defines, weights_check)
    except PlanError as e:
        raise PolicyViewError(str(e)) from None


def model_context(plan: dict, model: str) -> int | None:
    """The most tokens a sequence of `model` may hold: its config.json's max_position_embeddings, or the plan's
    `max_len` where lower; None where the folder cannot be read (loading the model says why, later)."""
    from tokenrouter.runtime.engine.base import EngineError
    from tokenrouter.runtime.engine.config import load_model_config

    entry = plan["models"][model]
    try:
        context = load_model_config(entry["path"]).max_position_embeddings
    except (EngineError, ValueError, OSError, KeyError, TypeError):
        return None
    return min(context, entry["max_len"]) if entry.get("max_len") else context


def context_error(plan: dict, need: int, asked: str, models: list[str] | None = None) -> str | None:
    """The message when sequences of `need` tokens (`asked`: the options that ask for them, e.g. "--seq-len
    4096") do not fit the context of every model of `models` (default: the plan's), else None. Checked before
    any work, so that a run does not fail on it after minutes of it."""
    for m in models or list(plan["models"]):
        context = model_context(plan, m)
        if context is not None and need > context:
            return f"{asked}: sequences of {need} tokens, but model {m!r} takes {context} at most"
    return None


@dataclass(slots=True)
class RoutedShape:
    entry: str
    targets: list[str]  # per entry rule, the model that writes the position when the rule fires
    ir: dict  # the entry model's route IR


def routed_shape(plan: dict) -> RoutedShape:
    entry = plan["entry"]
    ir = plan["routes"][entry]
    if not ir["rules"]:
        raise PolicyViewError(f"the entry model {entry!r} has no route rules: nothing is routed")
    return RoutedShape(entry, [_one_token_target(plan, entry, rule) for rule in ir["rules"]], ir)


def _one_token_target(plan: dict, entry: str, rule: dict) -> str:
    """The model an entry rule hands off to, which must drop the entry model's token, write one and return."""
    where = f"rule '{rule.get('source', '?')}' (line {rule.get('line', '?')})"
    if not rule["drop"]:
        raise PolicyViewError(
            f"{where}: teacher-forced evaluation supports `drop` hand-offs only (the target rewrites the "
            "position); this rule keeps the entry model's token"
        )
    target = rule["target"]
    back = plan["routes"][target]["rules"]
    one_token = rule["for"] == 1 or (
        rule["for"] is None
        and len(back) == 1
        and back[0]["cond"] is None
        and back[0]["target"] == entry
        and not back[0]["drop"]
    )
    if not one_token:
        raise PolicyViewError(
            f"{where}: teacher-forced evaluation supports hand-offs where {target!r} writes one token and "
            f"returns (`for 1`, or `route {target} {{ -> {entry} }}`)"
        )
    return target


_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "min": torch.minimum, "max": torch.maximum,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne,
    "and": torch.logical_and, "or": torch.logical_or,
}  # fmt: skip
_UNARY = {"neg": torch.neg, "not": torch.logical_not, "abs": torch.abs, "log": torch.log, "exp": torch.exp,
          "sigmoid": torch.sigmoid}  # fmt: skip
_DTYPES = {"int": torch.int64, "float": torch.float32, "bool": torch.bool}


def eval_ir(ir: dict, values: dict[str, torch.Tensor], n: int, override: dict[int, float] | None = None):
    """Values of every node of a route IR over n rows. ``values``: feature and router name -> [n]
    tensors (and "uniform"). ``override``: node index -> a float that replaces that const."""
    out: list[torch.Tensor] = []
    override = override or {}
    for i, node in enumerate(ir["nodes"]):
        op = node["op"]
        if op == "const":
            out.append(torch.full((n,), override.get(i, node["value"]), dtype=_DTYPES[node["type"]]))
        elif op in ("feature", "router"):
            if node["name"] not in values:
                raise PolicyViewError(f"route IR reads {op} {node['name']!r}, which is not computed")
            out.append(values[node["name"]])
        elif op == "uniform":
            out.append(values["uniform"])
        else:
            out.append(_apply(op, [out[a] for a in node.get("args", [])]))
    return out


def _apply(op: str, args: list[torch.Tensor]) -> torch.Tensor:
    """An arithmetic, comparison or logical node's value from its arguments'."""
    if op == "div":
        return args[0].float() / args[1].float()
    if op in _BINARY:
        a, b = args
        if op in ("add", "sub", "mul", "min", "max") and (a.is_floating_point() or b.is_floating_point()):
            a, b = a.float(), b.float()
        return _BINARY[op](a, b)
    if op in _UNARY:
        a = args[0]
        return _UNARY[op](a.float() if op in ("log", "exp", "sigmoid") else a)
    raise PolicyViewError(f"route IR operation {op!r} is not known to the evaluator")


def fired_rule(ir: dict, values: dict[str, torch.Tensor], n: int, override: dict[int, float] | None = None):
    """Index of the first rule whose condition holds per row, -1 = stay (as the route kernel outputs)."""
    nodes = eval_ir(ir, values, n, override)
    rule = torch.full((n,), -1, dtype=torch.int64)
    for i in reversed(range(len(ir["rules"]))):
        cond = ir["rules"][i]["cond"]
        hit = torch.ones(n, dtype=torch.bool) if cond is None else nodes[cond].bool()
        rule = torch.where(hit, torch.full_like(rule, i), rule)
    return rule


def threshold_node(plan: dict, ir: dict, param: str) -> int:
    """The index of the const node that is ``param`` folded in, found as the one side of a comparison
    whose value equals the param's. Raises PolicyViewError when there is no such node or several."""
    params = plan.get("params") or {}
    if param not in params:
        known = ", ".join(n for n, p in params.items() if p.get("type") in ("int", "float")) or "none"
        raise PolicyViewError(f"the policy has no param {param!r} to sweep (numeric params: {known})")
    value = params[param]["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyViewError(f"param {param!r} is not numeric")
    nodes = ir["nodes"]
    found = set()
    for node in nodes:
        if node["op"] in ("lt", "le", "gt", "ge"):
            for a in node["args"]:
                if nodes[a]["op"] == "const" and nodes[a]["value"] == value:
                    found.add(a)
    if len(found) != 1:
        why = "no comparison" if not found else "more than one comparison"
        raise PolicyViewError(
            f"cannot sweep {param!r}: {why} in the route block of {ir['model']!r} compares against its value "
            f"{value} (eval sweeps a param used as one side of one comparison)"
        )
    return found.pop()
