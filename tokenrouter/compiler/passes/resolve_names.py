"""Names: each declared once, no clash with features or built-ins, every reference known
(with "did you mean"), the root file's `policy` first and unique, one `entry`, route blocks and rule
targets naming models."""

from __future__ import annotations

from collections.abc import Iterator

from tokenrouter.compiler.program import FEATURES, Program, Unit
from tokenrouter.compiler.scope import BUILTINS, ROUTER_INPUTS, ROUTER_KINDS, lookup, visible
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, did_you_mean

MAX_HINTED = (
    50  # errors of a file that get a "did you mean" (each a search through every name); `check` shows 50
)


def resolve_names(program: Program) -> Program:
    diags: list[Diagnostic] = []
    for unit in program.units:
        diags += _declarations(unit)
        diags += _references(unit)
    if program.root is not None:
        diags += _root_structure(program.root)
    return program.with_(diags)


def _declarations(unit: Unit) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    seen: dict[str, ast.Ident] = {}
    named = [d for d in unit.module.decls if hasattr(d, "name") and isinstance(d.name, ast.Ident)]
    named = [d for d in named if not isinstance(d, ast.PolicyDecl)]
    idents = [d.name for d in named] + [d.alias for d in unit.decls(ast.ImportDecl) if d.alias]
    for ident in sorted(idents, key=lambda i: (i.span.line, i.span.col)):
        out.extend(_declared(unit, ident, seen))
    for alias, decl in unit.import_decls.items():
        if decl.alias is None and alias in seen:
            first = seen[alias].span
            out.append(
                unit.src.error(
                    decl.span,
                    f"this import is named '{alias}' (its policy name), which is already declared at {first.line}:{first.col}; write `import ... as NAME`",
                )
            )
    for fn in unit.decls(ast.FnDecl):
        args: set[str] = set()
        for a in fn.args:
            if a.name.name in args:
                out.append(unit.src.error(a.name.span, f"duplicate argument '{a.name.name}'"))
            args.add(a.name.name)
    return out


def _declared(unit: Unit, ident: ast.Ident, seen: dict[str, ast.Ident]) -> list[Diagnostic]:
    """A declared name, recorded in `seen`: the errors of a duplicate, or a feature or built-in redeclared."""
    out: list[Diagnostic] = []
    if ident.name in seen:
        first = seen[ident.name].span
        out.append(
            unit.src.error(
                ident.span, f"duplicate name '{ident.name}' (first declared at {first.line}:{first.col})"
            )
        )
    else:
        seen[ident.name] = ident
    if ident.name in FEATURES:
        out.append(
            unit.src.error(ident.span, f"'{ident.name}' is a per-step feature and cannot be redeclared")
        )
    elif ident.name in BUILTINS:
        out.append(
            unit.src.error(ident.span, f"'{ident.name}' is a built-in function and cannot be redeclared")
        )
    return out


def _root_structure(root: Unit) -> list[Diagnostic]:
    out = _policy_line(root)
    models = root.table(ast.ModelDecl)
    if not models:
        out.append(root.src.error(_end(root), "the policy declares no `model`"))
    entries = root.decls(ast.EntryDecl)
    if not entries:
        out.append(root.src.error(_end(root), "missing `entry MODEL` (the model where every request starts)"))
    for extra in entries[1:]:
        out.append(root.src.error(extra.span, "a policy has exactly one `entry`"))
    for e in entries:
        out += _model_ref(root, e.model, models)
    out += _route_blocks(root, models, len(out))
    return out


def _policy_line(root: Unit) -> list[Diagnostic]:
    """One `policy NAME`, the file's first declaration."""
    out: list[Diagnostic] = []
    policies = root.decls(ast.PolicyDecl)
    if not policies:
        out.append(
            root.src.error(
                ast.Span(1, 1, 1, 2), "missing `policy NAME` declaration (the first line of every file)"
            )
        )
        return out
    if root.module.decls[0] is not policies[0]:
        out.append(root.src.error(policies[0].span, "`policy` must be the first declaration of the file"))
    for extra in policies[1:]:
        out.append(root.src.error(extra.span, "a file has exactly one `policy` declaration"))
    return out


def _route_blocks(root: Unit, models, reported: int) -> list[Diagnostic]:
    """One route block per model, for a model of the policy, each rule's target one too (`reported`: the
    diagnostics so far, which decide whether a target's gets a did-you-mean hint)."""
    out: list[Diagnostic] = []
    seen: dict[str, ast.RouteDecl] = {}
    for r in root.decls(ast.RouteDecl):
        out += _model_ref(root, r.model, models)
        if r.model.name in seen:
            first = seen[r.model.name].span
            out.append(
                root.src.error(
                    r.model.span,
                    f"second route block for '{r.model.name}' (first at {first.line}:{first.col})",
                )
            )
        seen.setdefault(r.model.name, r)
        for rule in r.rules:
            out += _model_ref(root, rule.target, models, hint=reported + len(out) < MAX_HINTED)
    return out


def _end(unit: Unit) -> ast.Span:
    n = max(len(unit.src.lines), 1)
    return ast.Span(n, 1, n, 2)


def _model_ref(unit: Unit, ident: ast.Ident, models: dict, hint: bool = True) -> list[Diagnostic]:
    if ident.name in models:
        return []
    return [
        unit.src.error(
            ident.span, f"unknown model '{ident.name}'{did_you_mean(ident.name, models if hint else ())}"
        )
    ]


def _references(unit: Unit) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for expr, locals_ in _expressions(unit):
        for name, is_callee in _names(expr):
            out += _check_name(unit, name, is_callee, locals_, hint=len(out) < MAX_HINTED)
    for r in unit.decls(ast.RouterDecl):
        kind = r.call.func.dotted
        if kind not in ROUTER_KINDS:
            out.append(
                unit.src.error(
                    r.call.func.span,
                    f"unknown router kind '{kind}'; expected linear(...) or mlp(...){did_you_mean(kind, ROUTER_KINDS)}",
                )
            )
        for arg in r.call.args[1:]:
            out += _router_input_names(unit, arg)
        if r.call.args:
            for name, is_callee in _names(r.call.args[0]):
                out += _check_name(unit, name, is_callee, {})
    return out


def _router_input_names(unit: Unit, arg: ast.Expr) -> list[Diagnostic]:
    if not (isinstance(arg, ast.Call) and arg.func.dotted in ROUTER_INPUTS):
        hint = did_you_mean(arg.func.dotted, ROUTER_INPUTS) if isinstance(arg, ast.Call) else ""
        return [
            unit.src.error(
                arg.span,
                f"a router input is hidden(M), topk_logits(M, K), topk_logprobs(M, K) or embedding(M, token){hint}",
            )
        ]
    return []  # the model names inside are checked by check_types (models live in the root file)


def _expressions(unit: Unit) -> Iterator[tuple[ast.Expr, dict]]:
    for d in unit.module.decls:
        if isinstance(d, ast.ParamDecl):
            yield d.value, {}
        elif isinstance(d, ast.ModelDecl):
            yield d.path, {}
            for o in d.options or ():
                yield o.value, {}
        elif isinstance(d, ast.ServeDecl):
            for o in d.options:
                yield o.value, {}
        elif isinstance(d, ast.FnDecl):
            yield d.body, {a.name.name: a for a in d.args}
        elif isinstance(d, ast.RouteDecl) and unit.prefix == "":
            for rule in d.rules:
                if rule.cond is not None:
                    yield rule.cond, {}
                if rule.for_k is not None:
                    yield rule.for_k, {}


def _names(expr: ast.Expr) -> Iterator[tuple[ast.Name, bool]]:
    match expr:
        case ast.Name():
            yield expr, False
        case ast.Call(func=f, args=args):
            yield f, True
            for a in args:
                yield from _names(a)
        case ast.Unary(operand=x):
            yield from _names(x)
        case ast.Binary(left=a, right=b):
            yield from _names(a)
            yield from _names(b)
        case ast.In(left=a, items=items):
            yield from _names(a)
            yield from _names(items)
        case ast.ListExpr(items=items):
            for i in items:
                yield from _names(i)


def _check_callee(unit: Unit, name: ast.Name, hint: bool) -> list[Diagnostic]:
    """The errors of a called name: it must be a built-in or a fn."""
    if len(name.parts) == 1 and name.parts[0] in BUILTINS:
        return []
    if len(name.parts) == 1 and name.parts[0] in ROUTER_INPUTS + ROUTER_KINDS:
        return [unit.src.error(name.span, f"'{name.dotted}(...)' is only allowed in a `router` declaration")]
    ref = lookup(unit, name)
    if ref is not None and ref.kind == "fn":
        return []
    if ref is not None:
        return [unit.src.error(name.span, f"'{name.dotted}' is a {ref.kind}, not a function")]
    fns = [n for n in visible(unit) if n in BUILTINS or _is_fn(unit, n)] if hint else []
    return [unit.src.error(name.span, f"unknown function '{name.dotted}'{did_you_mean(name.dotted, fns)}")]


def _check_name(
    unit: Unit, name: ast.Name, is_callee: bool, locals_: dict, hint: bool = True
) -> list[Diagnostic]:
    """The errors of one name; `hint`: look for a "did you mean" (a search through every visible name)."""
    if is_callee:
        return _check_callee(unit, name, hint)
    ref = lookup(unit, name, locals_)
    if ref is None:
        if len(name.parts) == 2 and name.parts[0] not in unit.imports:
            msg = f"unknown import '{name.parts[0]}' in '{name.dotted}'"
        else:
            msg = f"unknown name '{name.dotted}'"
        return [
            unit.src.error(name.span, msg + did_you_mean(name.dotted, visible(unit, locals_) if hint else []))
        ]
    if ref.kind == "import":
        return [unit.src.error(name.span, f"'{name.dotted}' is an import; write '{name.dotted}.NAME'")]
    return []


def _is_fn(unit: Unit, dotted: str) -> bool:
    ref = lookup(unit, ast.Name(tuple(dotted.split("."))))
    return ref is not None and ref.kind == "fn"
