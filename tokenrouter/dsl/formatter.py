"""Canonical .tr source: `format_module(module) -> str`.

One declaration per line, two-space indented rules, options as `{ key: value, … }`, minimal parentheses,
comments kept (a comment on its own line stays above the next declaration or rule; a comment at the
end of a line stays at the end of that line), at most one blank line between declarations where the
source had one. A router's arguments and a model's or `serve`'s options that do not fit in `LINE_LENGTH`
columns are broken after commas, each further line aligned under the first argument. Formatting is
idempotent and preserves the parse.
"""

from __future__ import annotations

from tokenrouter.dsl import ast

# binding strength: higher binds tighter
PREC = {"or": 1, "and": 2, "not": 3, "cmp": 4, "in": 4, "+": 5, "-": 5, "*": 6, "/": 6, "neg": 7, "atom": 8}
CMP = {"<", "<=", ">", ">=", "==", "!="}
LINE_LENGTH = 100


def _prec(e: ast.Expr) -> int:
    match e:
        case ast.Binary(op=op):
            return PREC["cmp"] if op in CMP else PREC[op]
        case ast.Unary(op="not"):
            return PREC["not"]
        case ast.Unary():
            return PREC["neg"]
        case ast.In():
            return PREC["in"]
    return PREC["atom"]


def quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def format_expr(e: ast.Expr) -> str:
    match e:
        case ast.Number(value=v, text=t):
            return t or repr(v)
        case ast.String(value=v):
            return quote(v)
        case ast.Bool(value=v):
            return "true" if v else "false"
        case ast.Auto():
            return "auto"
        case ast.Name():
            return e.dotted
        case ast.Call(func=f, args=args):
            return f"{f.dotted}({', '.join(format_expr(a) for a in args)})"
        case ast.ListExpr(items=items):
            return "[" + ", ".join(format_expr(i) for i in items) + "]"
        case ast.Unary(op="not", operand=x):
            return "not " + _wrap(x, PREC["not"], right=True)
        case ast.Unary(op=op, operand=x):
            inner = _wrap(x, PREC["neg"], right=True)
            return op + inner
        case ast.In(left=lhs, items=items):
            return f"{_wrap(lhs, PREC['in'] + 1)} in {format_expr(items)}"
        case ast.Binary(op=op, left=lhs, right=rhs):
            p = _prec(e)
            if op in CMP:  # comparisons do not chain: both sides bind tighter
                return f"{_wrap(lhs, p + 1)} {op} {_wrap(rhs, p + 1)}"
            return f"{_wrap(lhs, p)} {op} {_wrap(rhs, p + 1)}"
    raise TypeError(f"not an expression: {e!r}")


def _wrap(e: ast.Expr, min_prec: int, right: bool = False) -> str:
    text = format_expr(e)
    p = _prec(e)
    if right and isinstance(e, ast.Unary):
        return text  # prefix operators nest without parentheses: `not not x`, `- -x`
    return text if p >= min_prec else f"({text})"


def fill(head: str, items: list[str], tail: str) -> str:
    """`head` + the items joined by ", " + `tail`, on one line where it fits in LINE_LENGTH columns; else
    broken after commas, as many items to a line as fit, each further line aligned under the first item (or
    indented by four where `head` is too long for that)."""
    one = head + ", ".join(items) + tail
    if len(one) <= LINE_LENGTH or len(items) < 2:
        return one
    indent = " " * (len(head) if len(head) <= LINE_LENGTH // 2 else 4)
    lines, line = [], head + items[0]
    for i, item in enumerate(items[1:], start=2):
        end = tail if i == len(items) else ","
        if len(line) + 2 + len(item) + len(end) <= LINE_LENGTH:
            line += ", " + item
        else:
            lines.append(line + ",")
            line = indent + item
    return "\n".join([*lines, line + tail])


def format_options(options: tuple[ast.Option, ...], head: str = "") -> str:
    """`{ key: value, … }` after `head` (which it returns with it), broken as `fill` breaks it."""
    if not options:
        return head + "{ }"
    return fill(head + "{ ", [f"{o.key.name}: {format_expr(o.value)}" for o in options], " }")


def format_rule(r: ast.Rule) -> str:
    parts = []
    if r.cond is not None:
        parts.append(f"when {format_expr(r.cond)}")
    parts.append(f"-> {r.target.name}")
    if r.drop:
        parts.append("drop")
    if r.for_k is not None:
        parts.append(f"for {format_expr(r.for_k)}")
    return " ".join(parts)


def format_decl_head(d: ast.Decl) -> str:
    match d:
        case ast.PolicyDecl(name=n, description=desc):
            return f"policy {n.name}" + (f" {quote(desc)}" if desc is not None else "")
        case ast.ParamDecl(name=n, type=t, value=v):
            return f"param {n.name}: {t.name} = {format_expr(v)}"
        case ast.ModelDecl(name=n, path=p, options=opts):
            head = f"model {n.name} = {format_expr(p)}"
            return head if opts is None else format_options(opts, head + " ")
        case ast.RouterDecl(name=n, call=ast.Call(func=f, args=args)):
            return fill(f"router {n.name} = {f.dotted}(", [format_expr(a) for a in args], ")")
        case ast.FnDecl(name=n, args=args, body=b):
            sig = ", ".join(f"{a.name.name}: {a.type.name}" for a in args)
            return f"fn {n.name}({sig}) = {format_expr(b)}"
        case ast.ServeDecl(options=opts):
            return format_options(opts, "serve ")
        case ast.EntryDecl(model=m):
            return f"entry {m.name}"
        case ast.ImportDecl(path=p, stdlib=s, alias=a):
            target = quote(p) if p is not None else f"stdlib.{s}"
            return f"import {target}" + (f" as {a.name}" if a is not None else "")
        case ast.RouteDecl(model=m):
            return f"route {m.name} {{"
    raise TypeError(f"not a declaration: {d!r}")


class _Comments:
    """Hands out the source's comments by line, each exactly once."""

    def __init__(self, comments: tuple[ast.Comment, ...]) -> None:
        self.pending = sorted(comments, key=lambda c: (c.line, c.col))

    def before(self, line: int) -> list[ast.Comment]:
        out = [c for c in self.pending if c.line < line]
        self.pending = [c for c in self.pending if c.line >= line]
        return out

    def within(self, first: int, last: int) -> list[ast.Comment]:
        out = [c for c in self.pending if first <= c.line <= last]
        self.pending = [c for c in self.pending if not (first <= c.line <= last)]
        return out

    def rest(self) -> list[ast.Comment]:
        out, self.pending = self.pending, []
        return out


def _with_trailing(text: str, trailing: list[ast.Comment]) -> str:
    if not trailing:
        return text
    return text + "  " + " ".join(c.text.rstrip() for c in trailing)


def format_module(module: ast.Module) -> str:
    comments = _Comments(module.comments)
    out: list[str] = []
    prev_end = 0
    for d in module.decls:
        leading = comments.before(d.span.line)
        first_line = leading[0].line if leading else d.span.line
        if out and first_line - prev_end > 1:
            out.append("")
        out.extend(c.text.rstrip() for c in leading)
        if isinstance(d, ast.RouteDecl):
            out.extend(_format_route(d, comments))
        else:
            out.append(_with_trailing(format_decl_head(d), comments.within(d.span.line, d.span.end_line)))
        prev_end = d.span.end_line
    tail = comments.rest()
    if tail:
        if out and tail[0].line - prev_end > 1:
            out.append("")
        out.extend(c.text.rstrip() for c in tail)
    return "\n".join(out) + "\n" if out else ""


def _format_route(d: ast.RouteDecl, comments: _Comments) -> list[str]:
    first_rule = d.rules[0].span.line if d.rules else d.span.end_line
    head_line = d.span.line
    head_trailing = comments.within(head_line, head_line) if first_rule > head_line else []
    lines = [_with_trailing(format_decl_head(d), head_trailing)]
    for r in d.rules:
        for c in comments.before(r.span.line):
            lines.append("  " + c.text.rstrip())
        lines.append("  " + _with_trailing(format_rule(r), comments.within(r.span.line, r.span.end_line)))
    closing = comments.before(d.span.end_line)
    lines.extend("  " + c.text.rstrip() for c in closing)
    lines.append(_with_trailing("}", comments.within(d.span.end_line, d.span.end_line)))
    return lines
