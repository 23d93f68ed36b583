"""AST of a .tr file: frozen dataclasses that carry their source span.

Spans never take part in equality (`compare=False`), so two parses of differently formatted but
equivalent sources compare equal. Every node has `span`; positions are 1-based (line, column).
"""

from __future__ import annotations

from dataclasses import dataclass, field

KEYWORDS = frozenset(
    {
        "policy", "param", "model", "router", "fn", "serve", "entry", "route", "import", "as",
        "when", "drop", "for", "and", "or", "not", "in", "true", "false", "auto",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Span:
    line: int
    col: int
    end_line: int
    end_col: int  # exclusive

    @staticmethod
    def unknown() -> Span:
        return Span(0, 0, 0, 0)


def _span() -> Span:
    return field(default_factory=Span.unknown, compare=False, repr=False)


# --- expressions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Number:
    value: int | float
    text: str = field(default="", compare=False)
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class String:
    value: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Bool:
    value: bool
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Name:
    """`x` or `alias.x` (a name brought in by an import)."""

    parts: tuple[str, ...]
    span: Span = _span()

    @property
    def dotted(self) -> str:
        return ".".join(self.parts)


@dataclass(frozen=True, slots=True)
class Call:
    func: Name
    args: tuple[Expr, ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # "-" or "not"
    operand: Expr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # + - * / < <= > >= == != and or
    left: Expr
    right: Expr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class ListExpr:
    items: tuple[Expr, ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class In:
    left: Expr
    items: ListExpr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Auto:
    """The option value `auto` (only in `batch: auto`)."""

    span: Span = _span()


Expr = Number | String | Bool | Name | Call | Unary | Binary | ListExpr | In | Auto


# --- declarations ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ident:
    """A declared or referenced bare name, with its own span (for diagnostics)."""

    name: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Option:
    key: Ident
    value: Expr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class PolicyDecl:
    name: Ident
    description: str | None
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class ParamDecl:
    name: Ident
    type: Ident
    value: Expr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class ModelDecl:
    name: Ident
    path: Expr
    options: tuple[Option, ...] | None
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class RouterDecl:
    name: Ident
    call: Call
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class FnArg:
    name: Ident
    type: Ident
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class FnDecl:
    name: Ident
    args: tuple[FnArg, ...]
    body: Expr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class ServeDecl:
    options: tuple[Option, ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class EntryDecl:
    model: Ident
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Rule:
    cond: Expr | None  # None: unconditional
    target: Ident
    drop: bool
    for_k: Expr | None
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class RouteDecl:
    model: Ident
    rules: tuple[Rule, ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class ImportDecl:
    path: str | None  # import "file.tr"
    stdlib: str | None  # import stdlib.NAME
    alias: Ident | None
    span: Span = _span()


Decl = (
    PolicyDecl | ParamDecl | ModelDecl | RouterDecl | FnDecl | ServeDecl | EntryDecl | RouteDecl | ImportDecl
)


@dataclass(frozen=True, slots=True)
class Comment:
    text: str  # including the leading '#'
    line: int
    col: int


@dataclass(frozen=True, slots=True)
class Module:
    """One parsed file. `comments` is kept for the formatter; it never takes part in equality."""

    decls: tuple[Decl, ...]
    file: str = field(default="", compare=False)
    comments: tuple[Comment, ...] = field(default=(), compare=False, repr=False)
