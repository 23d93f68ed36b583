"""Plans on disk: `write_plan` and `read_plan` (validated against docs/ir.md, `tokenrouter.plan/1`).

`read_plan` returns the plan dict with model and router paths made absolute (relative paths in a plan are
relative to the plan's directory; a hub id that is not a local folder stays as written). Anything wrong
— a missing file, bad JSON, another format or version, a hand-edit that breaks the schema — raises
`PlanError` with a message naming the file and the field.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import reprlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenrouter.compiler.passes.check_feasibility import feasibility, feasibility_error
from tokenrouter.compiler.passes.check_options import MAX_CONCURRENCY
from tokenrouter.compiler.passes.check_rules import MAX_FOR_K
from tokenrouter.compiler.paths import absolute_from_plan, relative_to_plan
from tokenrouter.compiler.program import FEATURES, TYPES
from tokenrouter.dsl.limits import route_constant_problem, value_problem
from tokenrouter.outfile import check_output, finite_json, write_replacing

PLAN_FORMAT = "tokenrouter.plan/1"
OPS_ARITY = {
    "add": 2, "sub": 2, "mul": 2, "div": 2, "neg": 1, "lt": 2, "le": 2, "gt": 2, "ge": 2, "eq": 2, "ne": 2,
    "and": 2, "or": 2, "not": 1, "min": 2, "max": 2, "abs": 1, "log": 1, "exp": 1, "sigmoid": 1,
}  # fmt: skip
LEAVES = ("const", "feature", "router", "uniform")
ROUTER_INPUT_KINDS = ("hidden", "topk_logits", "topk_logprobs", "embedding")


class PlanError(Exception):
    """A plan that cannot be used; the message names the file and the field."""


def write_plan(plan: dict[str, Any], path: str | Path, inputs: Iterable[str | Path] = ()) -> None:
    """Write `plan` as JSON; absolute model/router paths are stored relative to the plan's directory. The write
    refuses a path that would lose the user's data (`outfile.write_replacing`: `inputs`, a `.tr` source, a
    folder or other non-regular file) with an `OutputPathError` (an OSError)."""
    p = Path(path)
    out = copy.deepcopy(plan)
    base = check_output(p, inputs).parent
    for m in out.get("models", {}).values():
        if isinstance(m.get("path"), str):
            m["path"] = relative_to_plan(m["path"], base)
    for r in out.get("routers", {}).values():
        if isinstance(r.get("path"), str):
            r["path"] = relative_to_plan(r["path"], base)
    validate_plan(out, str(p))
    write_replacing(p, json.dumps(finite_json(out), indent=2, ensure_ascii=False) + "\n", inputs)


def routing_digest(plan: dict[str, Any]) -> str:
    """A sha256 of what decides a plan's routing: its models' names, entry, routes (constants folded in, so a
    parameter such as bernoulli's `p` counts) and routers (their weights by digest). Not the thresholds, the
    serve settings, file paths or the rules' source text: a plan tuned, served eager or moved keeps its digest.
    A server publishes it in `tokenrouter_plan_info`, and `profile --from-metrics` refuses metrics of another."""
    routes = {
        name: {**route, "rules": [{k: v for k, v in rule.items() if k not in ("source", "line")}
                                  for rule in route.get("rules", [])]}
        for name, route in plan.get("routes", {}).items()
    }  # fmt: skip
    routers = {
        name: {k: v for k, v in r.items() if k != "path"} for name, r in plan.get("routers", {}).items()
    }
    what = {"models": sorted(plan.get("models", {})), "entry": plan.get("entry"), "routes": routes,
            "routers": routers}  # fmt: skip
    return hashlib.sha256(json.dumps(what, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def co_runners(plan: dict) -> dict[str, list[str]]:
    """For each model, the other models placed on one of its GPUs, in plan order."""
    gpus = {m: set(spec.get("gpus", [0])) for m, spec in plan["models"].items()}
    return {m: [o for o in gpus if o != m and gpus[o] & g] for m, g in gpus.items()}


def read_plan(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlanError(f"{p}: no such plan file") from None
    except IsADirectoryError:
        raise PlanError(f"{p}: is a directory, not a plan file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PlanError(f"{p}: cannot read plan: {e}") from None
    try:
        plan = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError(f"{p}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    except RecursionError:
        raise PlanError(f"{p}: not a plan: its JSON is nested too deep") from None
    validate_plan(plan, str(p))
    base = p.resolve().parent
    for section in ("models", "routers"):
        for name, entry in plan[section].items():
            try:
                entry["path"] = absolute_from_plan(entry["path"], base)
            except ValueError as e:
                raise PlanError(f"{p}: field {section}.{name}.path: {e}") from None
    return plan


class _V:
    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, where: str, message: str) -> PlanError:
        return PlanError(f"{self.file}: field {where}: {message}")

    def obj(self, value: Any, where: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected an object, got {_kind(value)}")
        for k in keys:
            if k not in value:
                raise self.fail(f"{where}.{k}" if where else k, "missing")
        extra = set(value) - set(keys) - set(optional)
        if extra:
            raise self.fail(f"{where}.{sorted(extra)[0]}" if where else sorted(extra)[0], "unknown field")
        return value

    def check(self, ok: bool, where: str, message: str) -> None:
        if not ok:
            raise self.fail(where, message)


def _r(v: Any) -> str:
    """A value read from a plan, for a message: cut short however long or deep it is."""
    return reprlib.repr(v)


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a bool", int: "an int",
            float: "a float", type(None): "null"}.get(type(v), type(v).__name__)  # fmt: skip


def _one_of(v: Any, names: Any) -> bool:
    """`v in names` for a value read from a plan: a list or object there is simply not one of them."""
    return isinstance(v, str) and v in names


def _int(v: Any) -> bool:
    """An int the runtime holds (int64)."""
    return isinstance(v, int) and not isinstance(v, bool) and value_problem(v) is None


def _num(v: Any) -> bool:
    return (_int(v) or isinstance(v, float)) and math.isfinite(v)


def validate_plan(plan: Any, file: str = "<plan>") -> None:
    """Raise PlanError unless `plan` is a well-formed `tokenrouter.plan/1` plan."""
    v = _V(file)
    if not isinstance(plan, dict):
        raise v.fail("(top level)", f"expected an object, got {_kind(plan)}")
    _format(v, plan)
    keys = ("format", "policy", "source", "params", "models", "entry", "serve", "routers", "routes", "checks")
    v.obj(plan, "", keys, ("tuning",))  # `tuning`: written by `tokenrouter tune` (docs/tuning.md)
    if "tuning" in plan:
        _tuning(v, plan["tuning"], plan["models"])
    _policy_and_source(v, plan)
    _params(v, plan["params"])
    models = plan["models"]
    v.check(isinstance(models, dict) and bool(models), "models", "expected a non-empty object")
    for name, m in models.items():
        _model(v, f"models.{name}", m)
    v.check(_one_of(plan["entry"], models), "entry", f"{_r(plan['entry'])} is not one of the models")
    serve = _serve(v, plan)
    routers = plan["routers"]
    v.check(isinstance(routers, dict), "routers", "expected an object")
    for name, r in routers.items():
        _router(v, f"routers.{name}", r, models)
    _routes(v, plan["routes"], models, routers)
    _checks(v, plan, models, serve)


def _format(v: _V, plan: dict) -> None:
    """The plan's `format` is the one this build reads."""
    fmt = plan.get("format")
    if fmt != PLAN_FORMAT:
        if isinstance(fmt, str) and fmt.startswith("tokenrouter.plan/"):
            raise v.fail(
                "format",
                f"plan version '{fmt}' is not supported (this build reads {PLAN_FORMAT}); recompile the policy",
            )
        raise v.fail("format", f'expected "{PLAN_FORMAT}", got {_r(fmt)}: not a tokenrouter plan')


def _policy_and_source(v: _V, plan: dict) -> None:
    pol = v.obj(plan["policy"], "policy", ("name", "description"))
    v.check(isinstance(pol["name"], str) and bool(pol["name"]), "policy.name", "expected a non-empty string")
    v.check(
        pol["description"] is None or isinstance(pol["description"], str),
        "policy.description",
        "expected a string or null",
    )
    src = v.obj(plan["source"], "source", ("path", "sha256", "text"))
    v.check(isinstance(src["text"], str), "source.text", "expected a string")
    v.check(isinstance(src["path"], str), "source.path", "expected a string")
    if isinstance(src["text"], str):
        digest = hashlib.sha256(src["text"].encode("utf-8")).hexdigest()
        v.check(
            src["sha256"] == digest,
            "source.sha256",
            "does not match source.text (the plan was edited by hand; recompile it)",
        )


def _params(v: _V, params: Any) -> None:
    v.check(isinstance(params, dict), "params", "expected an object")
    for name, p in params.items():
        v.obj(p, f"params.{name}", ("type", "value"))
        v.check(_one_of(p["type"], TYPES), f"params.{name}.type", f"expected one of {', '.join(TYPES)}")
        ok = {
            "int": _int,
            "float": _num,
            "bool": lambda x: isinstance(x, bool),
            "str": lambda x: isinstance(x, str),
        }
        v.check(
            ok[p["type"]](p["value"]),
            f"params.{name}.value",
            f"expected {p['type']}, got {_kind(p['value'])}",
        )


def _serve(v: _V, plan: dict) -> dict:
    serve = v.obj(plan["serve"], "serve", ("concurrency", "max_delay_ms"))
    v.check(
        _int(serve["concurrency"]) and 1 <= serve["concurrency"] <= MAX_CONCURRENCY,
        "serve.concurrency",
        f"expected an int in [1, {MAX_CONCURRENCY}]",
    )
    v.check(
        _num(serve["max_delay_ms"]) and serve["max_delay_ms"] >= 0,
        "serve.max_delay_ms",
        "expected a number ≥ 0",
    )
    return serve


def _routes(v: _V, routes: Any, models: dict, routers: dict) -> None:
    v.check(isinstance(routes, dict), "routes", "expected an object")
    v.check(
        set(routes) == set(models),
        "routes",
        f"expected one entry per model ({', '.join(models)}), got {', '.join(routes) or 'none'}",
    )
    for name, route in routes.items():
        _route(v, f"routes.{name}", name, route, models, routers)


def _checks(v: _V, plan: dict, models: dict, serve: dict) -> None:
    """The progress and feasibility checks the compiler recorded hold for these models and serve settings."""
    checks = v.obj(plan["checks"], "checks", ("feasibility", "progress"))
    prog = v.obj(checks["progress"], "checks.progress", ("ok",), ("models",))
    v.check(prog["ok"] is True, "checks.progress.ok", "a plan that makes no progress cannot run")
    v.obj(
        checks["feasibility"],
        "checks.feasibility",
        ("ok", "concurrency", "fixed", "auto", "slack", "message"),
    )
    fixed = {m: s["batch"] for m, s in models.items() if s["batch"] != "auto"}
    error = feasibility_error(fixed, serve["concurrency"])
    if error:
        raise v.fail("models.*.batch", error)
    expected = feasibility(models, serve["concurrency"])
    for k in ("ok", "concurrency", "fixed", "auto", "slack"):
        v.check(
            checks["feasibility"][k] == expected[k],
            f"checks.feasibility.{k}",
            f"expected {expected[k]!r} for these models and serve settings",
        )


def _tuning(v: _V, t: Any, models: Any) -> None:
    """The fields of tune's record that its readers (tune, inspect) take apart; the rest is shown as found."""
    v.check(isinstance(t, dict), "tuning", "expected an object")
    if "auto" in t:
        auto = t["auto"]
        ok = isinstance(auto, list) and isinstance(models, dict) and all(_one_of(m, models) for m in auto)
        v.check(ok, "tuning.auto", "expected a list of the plan's models")
    if "concurrency" in t:
        v.check(_int(t["concurrency"]) and t["concurrency"] >= 1, "tuning.concurrency", "expected an int ≥ 1")
    if "warnings" in t:
        w = t["warnings"]
        v.check(
            isinstance(w, list) and all(isinstance(x, str) for x in w),
            "tuning.warnings",
            "expected a list of strings",
        )


def _model(v: _V, where: str, m: Any) -> None:
    v.obj(m, where, ("path", "gpus", "batch", "mem", "dtype", "max_len", "engine", "load"))
    v.check(isinstance(m["path"], str) and bool(m["path"]), f"{where}.path", "expected a non-empty string")
    gpus = m["gpus"]
    v.check(isinstance(gpus, list) and bool(gpus) and all(_int(g) and g >= 0 for g in gpus) and len(set(gpus)) == len(gpus),
            f"{where}.gpus", "expected a non-empty list of distinct ints ≥ 0")  # fmt: skip
    v.check(
        m["batch"] == "auto" or (_int(m["batch"]) and m["batch"] >= 1),
        f"{where}.batch",
        'expected an int ≥ 1 or "auto"',
    )
    v.check(
        m["mem"] is None or (_num(m["mem"]) and 0 < m["mem"] <= 1),
        f"{where}.mem",
        "expected a number in (0, 1] or null",
    )
    v.check(
        m["dtype"] in ("bfloat16", "float16", "float32"),
        f"{where}.dtype",
        "expected bfloat16, float16 or float32",
    )
    v.check(
        m["max_len"] is None or (_int(m["max_len"]) and m["max_len"] >= 1),
        f"{where}.max_len",
        "expected an int ≥ 1 or null",
    )
    v.check(m["engine"] in ("embedded", "sglang"), f"{where}.engine", 'expected "embedded" or "sglang"')
    v.check(m["load"] in ("auto", "dummy"), f"{where}.load", 'expected "auto" or "dummy"')


def _router(v: _V, where: str, r: Any, models: dict) -> None:
    v.obj(r, where, ("kind", "path", "sha256", "model", "inputs"))
    v.check(r["kind"] in ("linear", "mlp"), f"{where}.kind", 'expected "linear" or "mlp"')
    v.check(isinstance(r["path"], str) and bool(r["path"]), f"{where}.path", "expected a non-empty string")
    v.check(
        r["sha256"] is None or (isinstance(r["sha256"], str) and len(r["sha256"]) == 64),
        f"{where}.sha256",
        "expected a hex digest or null",
    )
    v.check(_one_of(r["model"], models), f"{where}.model", f"{_r(r['model'])} is not one of the models")
    v.check(
        isinstance(r["inputs"], list) and bool(r["inputs"]), f"{where}.inputs", "expected a non-empty list"
    )
    for i, inp in enumerate(r["inputs"]):
        _router_input(v, f"{where}.inputs[{i}]", inp, r["model"])


def _router_input(v: _V, w: str, inp: Any, model: Any) -> None:
    kind = inp.get("kind") if isinstance(inp, dict) else None
    v.check(kind in ROUTER_INPUT_KINDS, f"{w}.kind", f"expected one of {', '.join(ROUTER_INPUT_KINDS)}")
    if kind in ("topk_logits", "topk_logprobs"):
        v.obj(inp, w, ("kind", "model", "k"))
        v.check(_int(inp["k"]) and inp["k"] >= 1, f"{w}.k", "expected an int ≥ 1")
    else:
        v.obj(inp, w, ("kind", "model"))
    v.check(inp["model"] == model, f"{w}.model", f"expected {model!r} (all inputs read the router's model)")


def _route(v: _V, where: str, model: str, route: Any, models: dict, routers: dict) -> None:
    v.obj(route, where, ("model", "features", "routers", "uses_uniform", "nodes", "rules"))
    v.check(route["model"] == model, f"{where}.model", f"expected {model!r}")
    nodes = route["nodes"]
    v.check(isinstance(nodes, list), f"{where}.nodes", "expected a list")
    types: list[str] = []
    seen: dict[str, Any] = {"features": set(), "routers": set(), "uniform": False}
    for i, n in enumerate(nodes):
        w = f"{where}.nodes[{i}]"
        op = n.get("op") if isinstance(n, dict) else None
        v.check(_one_of(op, OPS_ARITY) or _one_of(op, LEAVES), f"{w}.op", f"{_r(op)} is not an IR operation")
        t = n.get("type")
        v.check(_one_of(t, ("int", "float", "bool")), f"{w}.type", "expected int, float or bool")
        if op in LEAVES:
            _leaf(v, w, n, op, t, model, routers, seen)
        else:
            _op_node(v, w, i, n, op, t, types)
        types.append(t)
    features, used_routers, uniform = sorted(seen["features"]), sorted(seen["routers"]), seen["uniform"]
    v.check(route["features"] == features, f"{where}.features", f"expected {features}")
    v.check(route["routers"] == used_routers, f"{where}.routers", f"expected {used_routers}")
    v.check(route["uses_uniform"] is uniform, f"{where}.uses_uniform", f"expected {str(uniform).lower()}")
    _rules(v, where, route["rules"], model, models, nodes, types)


def _leaf(v: _V, w: str, n: dict, op: str, t: Any, model: str, routers: dict, seen: dict) -> None:
    """A leaf node (const, feature, router, uniform); what it reads is added to `seen`."""
    if op == "const":
        _const_leaf(v, w, n, t)
    elif op == "feature":
        v.obj(n, w, ("op", "name", "type"))
        v.check(_one_of(n["name"], FEATURES), f"{w}.name", f"{_r(n['name'])} is not a feature")
        v.check(t == FEATURES[n["name"]], f"{w}.type", f"feature {n['name']} is {FEATURES[n['name']]}")
        seen["features"].add(n["name"])
    elif op == "router":
        v.obj(n, w, ("op", "name", "type"))
        v.check(_one_of(n["name"], routers), f"{w}.name", f"{_r(n['name'])} is not a router of the plan")
        v.check(
            routers[n["name"]]["model"] == model,
            f"{w}.name",
            f"router {_r(n['name'])} reads another model",
        )
        v.check(t == "float", f"{w}.type", "a router is float")
        seen["routers"].add(n["name"])
    else:  # uniform
        v.obj(n, w, ("op", "type"))
        v.check(t == "float", f"{w}.type", "uniform is float")
        seen["uniform"] = True


def _const_leaf(v: _V, w: str, n: dict, t: Any) -> None:
    v.obj(n, w, ("op", "value", "type"))
    val = n["value"]
    good = {"bool": isinstance(val, bool), "int": _int(val), "float": _num(val)}[t]
    v.check(good, f"{w}.value", f"expected a {t}" + (" (int64)" if t == "int" else ""))
    problem = route_constant_problem(val)
    v.check(problem is None, f"{w}.value", str(problem))


def _op_node(v: _V, w: str, i: int, n: dict, op: Any, t: Any, types: list[str]) -> None:
    """An operation node: its arguments are earlier nodes, of types it takes, and its type is its result's."""
    v.obj(n, w, ("op", "args", "type"))
    args = n["args"]
    v.check(
        isinstance(args, list) and len(args) == OPS_ARITY[op],
        f"{w}.args",
        f"{op} takes {OPS_ARITY[op]} argument(s)",
    )
    v.check(
        all(_int(a) and 0 <= a < i for a in args),
        f"{w}.args",
        "arguments must be indices of earlier nodes",
    )
    want = _result_type(op, [types[a] for a in args])
    v.check(want is not None, f"{w}.args", f"{op} cannot take {', '.join(types[a] for a in args)}")
    v.check(t == want, f"{w}.type", f"{op} of these arguments is {want}")


def _rules(v: _V, where: str, rules: Any, model: str, models: dict, nodes: list, types: list[str]) -> None:
    v.check(isinstance(rules, list), f"{where}.rules", "expected a list")
    for i, r in enumerate(rules):
        w = f"{where}.rules[{i}]"
        v.obj(r, w, ("cond", "target", "drop", "for", "source", "line"))
        if r["cond"] is None:
            v.check(i == len(rules) - 1, f"{w}.cond", "only the last rule may be unconditional")
        else:
            v.check(
                _int(r["cond"]) and 0 <= r["cond"] < len(nodes) and types[r["cond"]] == "bool",
                f"{w}.cond",
                "expected the index of a bool node or null",
            )
        v.check(
            _one_of(r["target"], models) and r["target"] != model,
            f"{w}.target",
            "expected another model of the plan",
        )
        v.check(isinstance(r["drop"], bool), f"{w}.drop", "expected a bool")
        v.check(
            r["for"] is None or (_int(r["for"]) and 1 <= r["for"] <= MAX_FOR_K),
            f"{w}.for",
            f"expected an int in [1, {MAX_FOR_K}] or null",
        )
        v.check(isinstance(r["source"], str), f"{w}.source", "expected a string")
        v.check(_int(r["line"]), f"{w}.line", "expected an int")


def _result_type(op: str, args: list[str]) -> str | None:
    num = ("int", "float")
    if op in ("add", "sub", "mul", "min", "max"):
        if all(a in num for a in args):
            return "int" if all(a == "int" for a in args) else "float"
        return None
    if op == "div":
        return "float" if all(a in num for a in args) else None
    if op in ("neg", "abs"):
        return args[0] if args[0] in num else None
    if op in ("log", "exp", "sigmoid"):
        return "float" if args[0] in num else None
    if op in ("lt", "le", "gt", "ge"):
        return "bool" if all(a in num for a in args) else None
    if op in ("eq", "ne"):
        ok = all(a in num for a in args) or all(a == "bool" for a in args)
        return "bool" if ok else None
    if op in ("and", "or"):
        return "bool" if all(a == "bool" for a in args) else None
    if op == "not":
        return "bool" if args[0] == "bool" else None
    return None
