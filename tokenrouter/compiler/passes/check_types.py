"""Types: elaborate every rule condition and router declaration into typed expressions (`TExpr`), with
params folded to constants and `fn` calls inlined (arity and argument types checked). Also checks that
a router is only read in the route block of the model it reads. Result: `program.routers`, `program.routes`.
"""

from __future__ import annotations

from typing import Any

from tokenrouter.compiler.consteval import ConstError, evaluate, type_of
from tokenrouter.compiler.passes.check_options import param_getter
from tokenrouter.compiler.paths import resolve_source_path
from tokenrouter.compiler.program import FEATURES, Program, TExpr, TypedRule, Unit
from tokenrouter.compiler.scope import BUILTINS, Ref, dependencies_first, lookup, plan_router_name, references
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, did_you_mean
from tokenrouter.dsl.limits import route_constant_problem

MAX_DEPTH = 200  # nesting of an expression, each fn body counted where it is inlined; far from Python's limit
MAX_OPS = 10_000  # operations of an expression once its fn calls are inlined (f(x) = g(x) + g(x) doubles)

ERR = TExpr("error", "error")
NUM = ("int", "float")
ARITH = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
COMPARE = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


def check_types(program: Program) -> Program:
    diags: list[Diagnostic] = []
    unavailable: dict[str, list[str]] = {}
    routers = _routers(program, diags, unavailable)
    elab = _Elaborator(program, routers, diags, unavailable)
    for unit, fn in _fns_callees_first(program):
        env = _fn_env(unit, fn, diags)
        key = unit.prefix + fn.name.name
        elab.top(fn.body, unit, env, None, (key,))
        if unit.table(ast.FnDecl).get(fn.name.name) is fn:
            elab.inlined[key] = None if elab.over else (elab.max_depth, elab.ops)
    routes: dict[str, tuple[TypedRule, ...]] = {name: () for name in program.models}
    root = program.root
    done: set[str] = set()
    for block in root.decls(ast.RouteDecl) if root else ():
        model = block.model.name
        if model not in program.models or model in done:
            continue
        done.add(model)
        routes[model] = tuple(_rule(elab, root, model, r, diags) for r in block.rules)
    return program.with_(diags, routers=routers, routes=routes)


def _fn_env(unit: Unit, fn: ast.FnDecl, diags: list[Diagnostic]) -> dict[str, TExpr]:
    """A fn's arguments as its body sees them; an unknown argument type is an error."""
    for a in fn.args:
        if a.type.name not in ("int", "float", "bool", "str"):
            problem = f"unknown type '{a.type.name}'; expected int, float, bool or str"
            diags.append(unit.src.error(a.type.span, problem))
    return {
        a.name.name: TExpr("arg", a.type.name if a.type.name in ("int", "float", "bool") else "error")
        for a in fn.args
    }


def _fns_callees_first(program: Program) -> list[tuple[Unit, ast.FnDecl]]:
    """Every fn declaration, each after the fns it calls, so that the size of every callee is known when a
    caller is checked (a repeated declaration, reported by resolve_names, comes last)."""
    fns = {u.prefix + name: (u, d) for u in program.units for name, d in u.table(ast.FnDecl).items()}
    calls = {}
    for key, (unit, fn) in fns.items():
        refs = (lookup(unit, name) for name in references(fn.body))
        calls[key] = [r.qualified for r in refs if r is not None and r.kind == "fn"]
    firsts = {id(d) for _, d in fns.values()}
    repeats = [(u, d) for u in program.units for d in u.decls(ast.FnDecl) if id(d) not in firsts]
    return [fns[k] for k in dependencies_first(calls)] + repeats


def _rule(elab: _Elaborator, root: Unit, model: str, rule: ast.Rule, diags: list[Diagnostic]) -> TypedRule:
    cond = None
    if rule.cond is not None:
        cond = elab.top(rule.cond, root, {}, model, ())
        if cond.type not in ("bool", "error"):
            diags.append(root.src.error(rule.cond.span, f"a rule condition must be bool, got {cond.type}"))
    for_k = None
    if rule.for_k is not None:
        try:
            k = evaluate(rule.for_k, root, param_getter(elab.program))
            if type_of(k) != "int":
                diags.append(root.src.error(rule.for_k.span, f"`for K` needs an int K, got {type_of(k)}"))
            else:
                for_k = k
        except ConstError as e:
            if e.message:
                diags.append(
                    root.src.error(e.span, f"`for K` needs a literal int or an int param: {e.message}")
                )
    return TypedRule(cond, rule.target.name, rule.drop, for_k, rule)


def _models_missing(decl: ast.RouterDecl, models: set[str]) -> list[str]:
    names = []
    for arg in decl.call.args[1:]:
        if isinstance(arg, ast.Call) and arg.args and isinstance(arg.args[0], ast.Name):
            name = arg.args[0].dotted
            if name not in models and name not in names:
                names.append(name)
    return names


def _routers(
    program: Program, diags: list[Diagnostic], unavailable: dict[str, list[str]]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    get = param_getter(program)
    models = set(program.models)
    for unit in program.units:
        for name, decl in unit.table(ast.RouterDecl).items():
            missing = _models_missing(decl, models) if unit.prefix else []
            if missing:  # an imported router over models this policy lacks: an error only where it is used
                unavailable[plan_router_name(Ref("router", unit, name))] = missing
                continue
            router = _router(unit, name, decl, models, get, diags)
            if router is not None:
                out[plan_router_name(Ref("router", unit, name))] = router
    return out


def _router(
    unit: Unit, name: str, decl: ast.RouterDecl, models: set[str], get, diags: list[Diagnostic]
) -> dict[str, Any] | None:
    """The plan's entry of one router declaration; None (with its errors in `diags`) where it has errors."""
    kind, args, span = decl.call.func.dotted, decl.call.args, decl.call.span
    if not args:
        diags.append(
            unit.src.error(span, f"{kind}(PATH, INPUTS…) needs a weights path and at least one input")
        )
        return None
    path = _router_path(unit, name, args[0], get, diags)
    if len(args) < 2:
        diags.append(unit.src.error(span, "a router needs at least one input, e.g. hidden(MODEL)"))
    inputs = [_router_input(unit, a, models, get, diags) for a in args[1:]]
    if any(i is None for i in inputs) or path is None or kind not in ("linear", "mlp"):
        return None
    owners = {i["model"] for i in inputs}
    if len(owners) > 1:
        problem = f"all inputs of a router must read one model, got {', '.join(sorted(owners))}"
        diags.append(unit.src.error(span, problem))
        return None
    return {
        "kind": kind, "path": path, "sha256": None, "model": owners.pop(), "inputs": inputs, "_decl": (unit, decl),
    }  # fmt: skip


def _router_path(unit: Unit, name: str, arg: ast.Expr, get, diags: list[Diagnostic]) -> str | None:
    """The router's weights path (a constant str, resolved from the policy's folder); None, reported, where it
    is not one."""
    try:
        value = evaluate(arg, unit, get)
        if isinstance(value, str) and value:
            return resolve_source_path(value, unit.dir)[0]
        diags.append(unit.src.error(arg.span, f"the router's weights path is a str, got {type_of(value)}"))
    except ConstError as e:
        if e.message:
            diags.append(unit.src.error(e.span, e.message))
    except ValueError as e:  # a path no file can have
        diags.append(unit.src.error(arg.span, f"router '{name}': {e}"))
    return None


def _input_model(
    unit: Unit, m: ast.Expr, usage: str, models: set[str], diags: list[Diagnostic]
) -> str | None:
    """The model a router input reads (its first argument), or None where that is not a model of the policy."""
    if not (isinstance(m, ast.Name) and len(m.parts) == 1 and m.parts[0] in models):
        shown = m.dotted if isinstance(m, ast.Name) else "this"
        hint = did_you_mean(shown, models)
        diags.append(unit.src.error(m.span, f"{usage}: '{shown}' is not a model of the policy{hint}"))
        return None
    return m.parts[0]


def _call_problem(e: ast.Call, fn: ast.FnDecl, key: str, stack: tuple) -> str | None:
    """What is wrong with a call of the fn `key` (recursion, the number of arguments), or None."""
    if key in stack:
        return f"fn '{key}' calls itself (through {' → '.join(stack)}); fns cannot recurse"
    if len(e.args) != len(fn.args):
        n = len(fn.args)
        return f"{e.func.dotted}() takes {n} argument{'s' if n != 1 else ''}, got {len(e.args)}"
    return None


def _router_input(unit: Unit, arg: ast.Expr, models: set[str], get, diags: list[Diagnostic]) -> dict | None:
    if not isinstance(arg, ast.Call):
        return None  # reported by resolve_names
    kind = arg.func.dotted
    want = {"hidden": 1, "topk_logits": 2, "topk_logprobs": 2, "embedding": 2}.get(kind)
    if want is None:
        return None
    usage = {"hidden": "hidden(MODEL)", "embedding": "embedding(MODEL, token)"}.get(kind, f"{kind}(MODEL, K)")
    if len(arg.args) != want:
        problem = f"{usage} takes {want} argument{'s' if want > 1 else ''}, got {len(arg.args)}"
        diags.append(unit.src.error(arg.span, problem))
        return None
    model = _input_model(unit, arg.args[0], usage, models, diags)
    if model is None:
        return None
    out: dict[str, Any] = {"kind": kind, "model": model}
    return out if kind == "hidden" else _second_argument(unit, arg, usage, get, diags, out)


def _second_argument(
    unit: Unit, arg: ast.Call, usage: str, get, diags: list[Diagnostic], out: dict[str, Any]
) -> dict | None:
    """The input `out` checked for its second argument: `token` for an embedding, else K (added as "k")."""
    if out["kind"] == "embedding":
        tok = arg.args[1]
        if not (isinstance(tok, ast.Name) and tok.parts == ("token",)):
            problem = "embedding(MODEL, token): the second argument is the word `token`"
            diags.append(unit.src.error(tok.span, problem))
            return None
        return out
    k = _top_k(unit, arg.args[1], usage, get, diags)
    if k is None:
        return None
    out["k"] = k
    return out


def _top_k(unit: Unit, arg: ast.Expr, usage: str, get, diags: list[Diagnostic]) -> int | None:
    """A top-k input's K: a constant int ≥ 1 (None, reported, otherwise)."""
    try:
        k = evaluate(arg, unit, get)
    except ConstError as e:
        if e.message:
            diags.append(unit.src.error(e.span, e.message))
        return None
    if type_of(k) != "int" or k < 1:
        diags.append(unit.src.error(arg.span, f"{usage}: K is an int ≥ 1, got {k!r}"))
        return None
    return k


class _Elaborator:
    def __init__(
        self,
        program: Program,
        routers: dict[str, dict[str, Any]],
        diags: list[Diagnostic],
        unavailable: dict[str, list[str]],
    ) -> None:
        self.program = program
        self.routers = routers
        self.diags = diags
        self.unavailable = unavailable
        # fn (qualified name) -> (depth, ops) of its body alone; None: too deep or too large (reported there)
        self.inlined: dict[str, tuple[int, int] | None] = {}
        self.depth = self.max_depth = self.ops = 0  # of the expression being elaborated (see `top`)
        self.over = False  # it went past MAX_DEPTH or MAX_OPS: reported once, the rest of it is skipped

    def err(self, unit: Unit, span: ast.Span, message: str) -> TExpr:
        self.diags.append(unit.src.error(span, message))
        return ERR

    def top(self, e: ast.Expr, unit: Unit, env: dict[str, TExpr], model: str | None, stack: tuple) -> TExpr:
        """Elaborate one whole expression (a rule condition, a fn body), counting its depth and size."""
        self.depth = self.max_depth = self.ops = 0
        self.over = False
        return self.expr(e, unit, env, model, stack)

    def const(self, unit: Unit, span: ast.Span, type_: str, value: Any, what: str) -> TExpr:
        """A constant of a rule; one the route kernel cannot hold (int64, float32) is an error here."""
        problem = route_constant_problem(value) if type_ in NUM else None
        if problem is not None:
            return self.err(unit, span, f"{what}{problem}")
        return TExpr("const", type_, value=value)

    def too_big(self, unit: Unit, span: ast.Span, message: str) -> TExpr:
        self.over = True
        return self.err(unit, span, message)

    def expr(self, e: ast.Expr, unit: Unit, env: dict[str, TExpr], model: str | None, stack: tuple) -> TExpr:
        if self.over:
            return ERR
        self.ops += 1
        if self.ops > MAX_OPS:
            return self.too_big(
                unit,
                e.span,
                f"the expression expands to more than {MAX_OPS} operations once fn calls are inlined",
            )
        if self.depth >= MAX_DEPTH:
            return self.too_big(
                unit, e.span, f"nested more than {MAX_DEPTH} levels deep once fn calls are inlined"
            )
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)
        try:
            return self._expr(e, unit, env, model, stack)
        finally:
            self.depth -= 1

    def _expr(self, e: ast.Expr, unit: Unit, env: dict[str, TExpr], model: str | None, stack: tuple) -> TExpr:
        match e:
            case ast.Bool(value=v):
                return TExpr("const", "bool", value=v)
            case ast.Number(value=v):
                return self.const(unit, e.span, "int" if isinstance(v, int) else "float", v, "")
            case ast.String():
                return TExpr("const", "str", value=e.value)
            case ast.Auto():
                return self.err(unit, e.span, "`auto` is only allowed as `batch: auto`")
            case ast.ListExpr():
                return self.err(unit, e.span, "a list is only allowed after `in`")
            case ast.Name():
                return self.name(e, unit, env, model)
            case ast.Unary(op=op, operand=x):
                return self.unary(e, unit, op, self.expr(x, unit, env, model, stack))
            case ast.Binary(op=op, left=lhs, right=rhs):
                a = self.expr(lhs, unit, env, model, stack)
                b = self.expr(rhs, unit, env, model, stack)
                return self.binary(e, unit, op, a, b)
            case ast.In():
                return self.membership(e, unit, env, model, stack)
            case ast.Call():
                return self.call(e, unit, env, model, stack)
        return self.err(unit, e.span, "unsupported expression")

    def unary(self, e: ast.Unary, unit: Unit, op: str, t: TExpr) -> TExpr:
        if t.type == "error":
            return ERR
        if op == "-":
            if t.type not in NUM:
                return self.err(unit, e.span, f"'-' needs a number, got {t.type}")
            return TExpr("neg", t.type, (t,))
        if t.type != "bool":
            return self.err(unit, e.span, f"'not' needs a bool, got {t.type}")
        return TExpr("not", "bool", (t,))

    def membership(
        self, e: ast.In, unit: Unit, env: dict[str, TExpr], model: str | None, stack: tuple
    ) -> TExpr:
        """`x in [a, b, …]` as `x == a or x == b or …`."""
        lhs, items = e.left, e.items
        a = self.expr(lhs, unit, env, model, stack)
        if not items.items:
            return self.err(unit, items.span, "`in` needs a non-empty list")
        out: TExpr | None = None
        for item in items.items:
            b = self.expr(item, unit, env, model, stack)
            eq = self.binary(ast.Binary("==", lhs, item, e.span), unit, "==", a, b)
            out = eq if out is None else TExpr("or", "bool", (out, eq))
            if eq.type == "error":
                return ERR
        assert out is not None
        return out

    def router(self, e: ast.Name, unit: Unit, ref: Ref, model: str | None) -> TExpr:
        """A router's score, where the route block of `model` may read it."""
        name = plan_router_name(ref)
        router = self.routers.get(name)
        if router is None and name in self.unavailable and model is not None:
            missing = ", ".join(self.unavailable[name])
            return self.err(
                unit,
                e.span,
                f"router '{e.dotted}' reads model {missing}, which this policy does not declare",
            )
        if router is None:
            return ERR
        if model is not None and router["model"] != model:
            return self.err(
                unit,
                e.span,
                f"router '{e.dotted}' reads model '{router['model']}'; it cannot be used in the route block of '{model}'",
            )
        return TExpr("router", "float", name=name)

    def name(self, e: ast.Name, unit: Unit, env: dict[str, TExpr], model: str | None) -> TExpr:
        ref = lookup(unit, e, env)
        if ref is None:
            return ERR  # reported by resolve_names
        if ref.kind == "local":
            return ref.decl
        if ref.kind == "feature":
            return TExpr("feature", FEATURES[ref.name], name=ref.name)
        if ref.kind == "param":
            entry = self.program.params.get(ref.qualified)
            if entry is None:
                return ERR
            return self.const(unit, e.span, entry["type"], entry["value"], f"param '{ref.qualified}': ")
        if ref.kind == "router":
            return self.router(e, unit, ref, model)
        if ref.kind == "fn":
            return self.err(unit, e.span, f"'{e.dotted}' is a fn; call it: {e.dotted}(...)")
        if ref.kind == "import":
            return ERR  # reported by resolve_names
        return self.err(unit, e.span, f"'{e.dotted}' is a {ref.kind}, not a value")

    def binary(self, e: ast.Binary, unit: Unit, op: str, a: TExpr, b: TExpr) -> TExpr:
        if a.type == "error" or b.type == "error":
            return ERR
        if "str" in (a.type, b.type):
            return self.err(
                unit, e.span, f"strings cannot appear in rule conditions ('{op}' on {a.type} and {b.type})"
            )
        if op in ("and", "or"):
            if a.type != "bool" or b.type != "bool":
                return self.err(unit, e.span, f"'{op}' needs bools, got {a.type} and {b.type}")
            return TExpr(op, "bool", (a, b))
        if op in ("==", "!=") and a.type == b.type == "bool":
            return TExpr(COMPARE[op], "bool", (a, b))
        if a.type not in NUM or b.type not in NUM:
            return self.err(unit, e.span, f"'{op}' needs numbers, got {a.type} and {b.type}")
        if op in COMPARE:
            return TExpr(COMPARE[op], "bool", (a, b))
        t = "int" if a.type == b.type == "int" and op != "/" else "float"
        return TExpr(ARITH[op], t, (a, b))

    def call(self, e: ast.Call, unit: Unit, env: dict[str, TExpr], model: str | None, stack: tuple) -> TExpr:
        if len(e.func.parts) == 1 and e.func.dotted in BUILTINS:
            return self._builtin(e, unit, env, model, stack)
        ref = lookup(unit, e.func)
        if ref is None or ref.kind != "fn":
            return ERR  # reported by resolve_names
        fn: ast.FnDecl = ref.decl
        key = ref.qualified
        if (problem := _call_problem(e, fn, key, stack)) is not None:
            return self.err(unit, e.span, problem)
        bound = self._bind(e, fn, unit, env, model, stack)
        if bound is None:
            return ERR
        too_big = self._inline_limit(e, key, unit)
        if too_big is not None:
            return too_big
        n_before = len(self.diags)
        body = self.expr(fn.body, ref.unit, bound, model, stack + (key,))
        if body.type == "error" and len(self.diags) == n_before:
            return ERR
        return body

    def _builtin(
        self, e: ast.Call, unit: Unit, env: dict[str, TExpr], model: str | None, stack: tuple
    ) -> TExpr:
        """A call of a builtin (min, max, abs, uniform, ...): its arity, and numbers for arguments."""
        fname = e.func.dotted
        lo, hi = BUILTINS[fname]
        n = len(e.args)
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"at least {lo}"
            return self.err(unit, e.span, f"{fname}() takes {want} argument{'s' if lo != 1 else ''}, got {n}")
        args = [self.expr(a, unit, env, model, stack) for a in e.args]
        if any(a.type == "error" for a in args):
            return ERR
        if fname == "uniform":
            return TExpr("uniform", "float")
        for a, node in zip(args, e.args, strict=False):
            if a.type not in NUM:
                return self.err(unit, node.span, f"{fname}() needs numbers, got {a.type}")
        if fname in ("min", "max"):
            out = args[0]
            for a in args[1:]:
                t = "int" if out.type == a.type == "int" else "float"
                out = TExpr(fname, t, (out, a))
            return out
        t = args[0].type if fname == "abs" else "float"
        return TExpr(fname, t, (args[0],))

    def _bind(
        self, e: ast.Call, fn: ast.FnDecl, unit: Unit, env: dict[str, TExpr], model: str | None, stack: tuple
    ) -> dict[str, TExpr] | None:
        """A fn's parameters bound to the call's typed arguments; None where an argument is in error or of the
        wrong type (reported)."""
        bound: dict[str, TExpr] = {}
        ok = True
        for param, arg in zip(fn.args, e.args, strict=False):
            t = self.expr(arg, unit, env, model, stack)
            want = param.type.name
            if t.type == "error":
                ok = False
            elif not (t.type == want or (want == "float" and t.type == "int")):
                self.err(
                    unit,
                    arg.span,
                    f"argument '{param.name.name}' of {e.func.dotted}() is {want}, got {t.type}",
                )
                ok = False
            bound[param.name.name] = t
        return bound if ok else None

    def _inline_limit(self, e: ast.Call, key: str, unit: Unit) -> TExpr | None:
        """ERR where inlining fn `key` here would pass the depth or size limit (reported); None where it fits."""
        fname = e.func.dotted
        size = self.inlined.get(key, (0, 0))
        if size is None:  # too deep or too large by itself: reported in its body; skip the rest here
            self.over = True
            return ERR
        depth, ops = size
        if self.depth + depth > MAX_DEPTH:
            return self.too_big(
                unit,
                e.span,
                f"fn calls nested too deep: inlined here, {fname}() makes the expression {self.depth + depth} "
                f"levels deep; at most {MAX_DEPTH} are allowed",
            )
        if self.ops + ops > MAX_OPS:
            return self.too_big(
                unit,
                e.span,
                f"{fname}() expands to {ops} operations once its fn calls are inlined; with the rest of the "
                f"expression that is more than {MAX_OPS} (does each fn call the next more than once?)",
            )
        return None
