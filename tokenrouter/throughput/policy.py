"""The routing matrices a policy implies, read from its route IR (docs/ir.md).

A rule's probability is known when its condition depends on nothing but `uniform()` and constants: the
condition is evaluated symbolically as a set of intervals of u ∈ [0, 1) (numbers are affine in u:
`a·u + b`; comparisons of two affine values give an interval; `and`/`or`/`not` are intersection, union,
complement). Rules are tried in order on the same draw, so rule k fires on `cond_k ∖ (cond_1 ∪ … ∪ cond_{k−1})`;
an unconditional rule takes what is left; the rest is the probability of staying. Anything else (features,
routers) makes that model's row unknown: it must come from `--p` or a profile.

Committed tokens: staying commits the token (c_ii = 1); a hop commits it unless the rule says `drop`
(c_ij = probability-weighted share of kept hops to j). `-> j for K` sends the request to j for K tokens and
back: j's row is then implied as back with probability 1/K (a geometric run with the right mean, K tokens on
average, each committed) — when every hop into j is such a `for K` hop from one model with one K and j has no
rules of its own; otherwise j's row must be given. Either way the return of a `for K` run commits its token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

Interval = tuple[float, float]
_FULL: list[Interval] = [(0.0, 1.0)]


class _Unknown(Exception):
    pass


@dataclass(slots=True)
class PolicyRouting:
    models: tuple[str, ...]
    rows: dict[str, dict[str, float]]  # model -> {target: probability} (target == model: stay)
    keep: dict[str, dict[str, float]]  # model -> {target: committed tokens of that transition}
    unknown: dict[str, str] = field(default_factory=dict)  # model -> why its row is not implied


def _norm(iv: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for lo, hi in sorted((max(lo, 0.0), min(hi, 1.0)) for lo, hi in iv):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _inter(a: list[Interval], b: list[Interval]) -> list[Interval]:
    return _norm([(max(x0, y0), min(x1, y1)) for x0, x1 in a for y0, y1 in b])


def _compl(a: list[Interval]) -> list[Interval]:
    out, cur = [], 0.0
    for lo, hi in _norm(a):
        out.append((cur, lo))
        cur = hi
    out.append((cur, 1.0))
    return _norm(out)


def _measure(a: list[Interval]) -> float:
    return sum(hi - lo for lo, hi in _norm(a))


_FOLD = {"abs": abs, "exp": math.exp, "log": math.log, "sigmoid": lambda x: 1 / (1 + math.exp(-x))}


def _value(nodes: list[dict], idx: int, memo: dict[int, Any]) -> Any:
    """Affine (a, b) meaning a·u + b, or ("bool", intervals); raises _Unknown."""
    if idx in memo:
        return memo[idx]
    n = nodes[idx]
    op = n["op"]
    args = [_value(nodes, a, memo) for a in n.get("args", [])]
    if op == "const":
        v = n["value"]
        out: Any = ("bool", _FULL if v else []) if isinstance(v, bool) else (0.0, float(v))
    elif op == "uniform":
        out = (1.0, 0.0)
    elif op in ("feature", "router"):
        raise _Unknown(f"{op} {n.get('name')}")
    elif op in _ARITH or op in _FOLD:
        out = _arith(op, args)
    elif op in _LOGIC:
        out = ("bool", _logic(op, args))
    else:
        raise _Unknown(f"operation {op}")
    memo[idx] = out
    return out


_ARITH = ("add", "sub", "neg", "mul", "div", "min", "max")
_LOGIC = ("lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not")


def _logic(op: str, args: list) -> list[Interval]:
    """The intervals of u where a comparison of affine values, or a boolean operation, holds."""
    if op in ("and", "or"):
        x, y = args[0][1], args[1][1]
        return _inter(x, y) if op == "and" else _norm(x + y)
    if op == "not":
        return _compl(args[0][1])
    (a1, b1), (a2, b2) = args
    a, b = a1 - a2, b1 - b2  # compare a·u + b with 0
    return _compare(op, a, b)


def _arith(op: str, args: list) -> tuple[float, float]:
    """An arithmetic operation on affine values, affine again; raises _Unknown where it would not be."""
    if op == "neg":
        return (-args[0][0], -args[0][1])
    if op in _FOLD:
        a1, b1 = args[0]
        if a1:
            raise _Unknown(f"{op} of uniform()")
        return (0.0, float(_FOLD[op](b1)))
    (a1, b1), (a2, b2) = args
    if op in ("add", "sub"):
        s = 1.0 if op == "add" else -1.0
        return (a1 + s * a2, b1 + s * b2)
    if op == "mul":
        if a1 and a2:
            raise _Unknown("uniform() squared")
        return (a1 * b2 + a2 * b1, b1 * b2)
    if op == "div":
        if a2 or b2 == 0:
            raise _Unknown("division by uniform() or zero")
        return (a1 / b2, b1 / b2)
    if a1 or a2:  # min, max
        raise _Unknown(f"{op} of uniform()")
    return (0.0, (min if op == "min" else max)(b1, b2))


def _compare(op: str, a: float, b: float) -> list[Interval]:
    if op in ("eq", "ne"):  # a set of measure zero (or everything)
        hit = a == 0 and b == 0
        return _FULL if (hit if op == "eq" else not hit) else ([] if op == "eq" else _FULL)
    if a == 0:
        holds = {"lt": b < 0, "le": b <= 0, "gt": b > 0, "ge": b >= 0}[op]
        return _FULL if holds else []
    root = -b / a
    below = (op in ("lt", "le")) == (a > 0)  # the condition holds for u below the root
    return _norm([(0.0, root)] if below else [(root, 1.0)])


def policy_routing(plan: dict) -> PolicyRouting:
    """The routing rows and committed tokens the plan's route blocks imply (see the module docstring)."""
    models = tuple(plan["models"])
    rows: dict[str, dict[str, float]] = {}
    keep: dict[str, dict[str, float]] = {m: {m: 1.0} for m in models}
    unknown: dict[str, str] = {}
    for_hops: dict[str, list[tuple[str, int]]] = {}
    plain_into: set[str] = set()
    for m in models:
        rules = plan["routes"][m]["rules"]
        for rule in rules:
            if rule.get("for") is not None:
                for_hops.setdefault(rule["target"], []).append((m, int(rule["for"])))
            else:
                plain_into.add(rule["target"])
        row, kept, why = _rules_row(m, plan["routes"][m])
        keep[m].update(_kept_shares(kept))
        if why:
            unknown[m] = why
        else:
            rows[m] = row
    routing = PolicyRouting(models, rows, keep, unknown)
    _add_for_hops(plan, for_hops, plain_into, routing)
    return routing


def _add_for_hops(
    plan: dict, for_hops: dict[str, list[tuple[str, int]]], plain_into: set[str], routing: PolicyRouting
) -> None:
    """The rows of the models entered by `for K` hops, in place: from the one model that hands them its
    requests for K tokens; unknown where that is not the whole story."""
    rows, keep, unknown = routing.rows, routing.keep, routing.unknown
    for j, hops in for_hops.items():
        for i, _ in hops:  # a `for K` run's tokens are committed, the last one too as it returns
            keep[j].setdefault(i, 1.0)
        why = _for_hops_unknown(sorted(set(hops)), bool(plan["routes"][j]["rules"]), j in plain_into)
        if why:
            unknown.setdefault(j, why)
            rows.pop(j, None)
            continue
        (i, k) = hops[0]
        rows[j] = {i: 1.0 / k} | ({j: 1.0 - 1.0 / k} if k > 1 else {})


def _rules_row(model: str, route: dict):
    """A model's row from its rules, tried in order on one draw (the rest: staying); each target's (probability,
    kept) per rule; and why the row is not known (None where it is)."""
    nodes, memo = route["nodes"], {}
    remaining = list(_FULL)
    row: dict[str, float] = {}
    kept: dict[str, list[tuple[float, bool]]] = {}
    why = None
    for rule in route["rules"]:
        tgt = rule["target"]
        prob, region, unknown = _rule_region(rule, nodes, memo, remaining)
        why = why or unknown
        kept.setdefault(tgt, []).append((prob, not rule["drop"]))
        if not math.isnan(prob):
            row[tgt] = row.get(tgt, 0.0) + prob
            remaining = _inter(remaining, _compl(region))
    if why:
        return None, kept, why
    row[model] = _measure(remaining)
    return {k: v for k, v in row.items() if v > 0}, kept, None


def _rule_region(rule: dict, nodes: list[dict], memo: dict, remaining: list[Interval]):
    """(probability, region of u) where the rule fires among the draws `remaining`; (nan, [], why) where that
    depends on more than u."""
    try:
        region = (
            remaining if rule["cond"] is None else _inter(_value(nodes, rule["cond"], memo)[1], remaining)
        )
        return _measure(region), region, None
    except _Unknown as exc:
        return (
            math.nan,
            [],
            f"rule '{rule.get('source', '?')}' (line {rule.get('line', '?')}) depends on {exc}",
        )


def _kept_shares(kept: dict[str, list[tuple[float, bool]]]) -> dict[str, float]:
    """The committed tokens of each transition: the probability-weighted share of its rules that keep the
    token (each rule alike where none has a known probability)."""
    out = {}
    for tgt, parts in kept.items():
        known = [(w, k) for w, k in parts if not math.isnan(w) and w > 0]
        if known:
            out[tgt] = sum(w for w, k in known if k) / sum(w for w, _ in known)
        else:
            out[tgt] = sum(1.0 for _, k in parts if k) / len(parts)
    return out


def _for_hops_unknown(hops: list[tuple[str, int]], own_rules: bool, plain_hops: bool) -> str | None:
    """Why the row of a model that `for K` hops (source, K) reach is not implied; None when it is."""
    froms = " and ".join(f"{i} (for {k})" for i, k in hops)
    if own_rules or plain_hops:
        return (
            f"requests arrive by `for K` hops from {froms}"
            + (", and by hops without `for`" if plain_hops else "")
            + (", and it has rules of its own" if own_rules else "")
        )
    if len(hops) > 1:
        return (
            f"requests arrive by `for K` hops from {froms}: where one goes back depends on where it came from"
        )
    return None
