"""Parse .tr source into a `Module` AST, collecting syntax errors as diagnostics.

The grammar is `tr.lark` (LALR, strict). On a syntax error the parser reports it in words, blanks the
broken declaration (from the declaration keyword before the error to the next one after it, keeping line
breaks so that positions stay true) and parses again, so one run reports every declaration that is broken.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import re
from dataclasses import dataclass
from pathlib import Path

import lark
from lark import Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, SourceMap
from tokenrouter.dsl.limits import INT64_MAX
from tokenrouter.dsl.source import MAX_SOURCE_BYTES, read_source, too_large
from tokenrouter.dsl.syntax_messages import describe_unexpected_characters, describe_unexpected_token

GRAMMAR_PATH = Path(__file__).with_name("tr.lark")
DECL_KEYWORDS = ("policy", "param", "model", "router", "fn", "serve", "entry", "route", "import")
MAX_RECOVERIES = 64
RECOVERY_BUDGET = MAX_SOURCE_BYTES  # characters parsed again after errors: a large broken file stays fast
MAX_DEPTH = 100  # nesting of the syntax tree; keeps every later (recursive) stage far from Python's limit

_DECL_START = re.compile(r'"(?:[^"\\\n]|\\.)*"|#[^\n]*|\b(' + "|".join(DECL_KEYWORDS) + r")\b")


@functools.cache
def lark_parser(strict: bool | None = None) -> lark.Lark:
    """The LALR parser. `strict` (grammar conflicts are errors) needs `interegular`; on by default when present."""
    if strict is None:
        strict = importlib.util.find_spec("interegular") is not None
    return lark.Lark(
        GRAMMAR_PATH.read_text(encoding="utf-8"),
        parser="lalr",
        lexer="basic",
        strict=strict,
        propagate_positions=True,
        maybe_placeholders=True,
    )


@dataclass(slots=True)
class ParseResult:
    module: ast.Module | None  # None when the file had syntax errors
    diagnostics: list[Diagnostic]

    @property
    def ok(self) -> bool:
        return self.module is not None and not any(d.is_error for d in self.diagnostics)


def parse(text: str, file: str = "<input>") -> ParseResult:
    """Parse `text`; never raises for any input text."""
    if len(text) > MAX_SOURCE_BYTES:
        problem = too_large(len(text.encode("utf-8", errors="surrogatepass")))
        if problem is not None:
            return ParseResult(None, [Diagnostic("error", file, 0, 0, problem)])
    src = SourceMap(file, text)
    diagnostics: list[Diagnostic] = []
    comments: list[Token] = []
    tree = _parse_recovering(text, src, diagnostics, comments)
    if tree is None:
        return ParseResult(None, diagnostics)
    too_deep = _too_deep(tree)
    if too_deep is not None:
        return ParseResult(
            None,
            diagnostics
            + [
                src.error(
                    too_deep, f"nested more than {MAX_DEPTH} levels deep; split the expression with a fn"
                )
            ],
        )
    builder = _Builder()
    try:
        decls = builder.transform(tree)
    except VisitError as e:  # a bug in the builder, never a user's mistake
        raise e.orig_exc from e
    diagnostics += [src.error(span, msg) for span, msg in builder.errors]
    if diagnostics:
        diagnostics.sort(key=lambda d: (d.line, d.col))
        return ParseResult(None, diagnostics)
    module = ast.Module(
        decls=tuple(decls),
        file=file,
        comments=tuple(ast.Comment(str(c), c.line, c.column) for c in comments),
    )
    return ParseResult(module, [])


def _parse_recovering(text: str, src: SourceMap, diagnostics: list[Diagnostic], comments: list[Token]):
    """The parse tree (None: none), a syntax error's diagnostic appended to `diagnostics` and the declaration
    it broke blanked out before parsing again, so that one run reports the file's several errors; the last
    parse's comments in `comments`."""
    work = text
    reparsed = 0  # characters parsed again after errors: each recovery parses the file up to its next error
    for _ in range(MAX_RECOVERIES):
        comments.clear()
        try:
            return _parse_collecting(work, comments)
        except UnexpectedInput as e:
            diagnostics.append(_syntax_diagnostic(src, e, work))
            offset = _offset_of(e, work)
            reparsed += offset
            blanked = _blank_broken_decl(work, offset)
            if blanked is None or reparsed > RECOVERY_BUDGET:
                return None
            work = blanked
    return None


def parse_file(path: str | Path) -> ParseResult:
    """Parse a file; an unreadable file is a diagnostic, not an exception."""
    text, problem = read_source(path, str(path))
    if text is None:
        assert problem is not None
        return ParseResult(None, [problem])
    return parse(text, str(path))


def _parse_collecting(text: str, comments: list[Token]) -> lark.Tree:
    comments.clear()
    parser = lark_parser()
    # Comments are %ignore'd by the grammar; a second pass over the lexer stream would lose them, so
    # collect them with a regex that skips strings (comments cannot occur inside a string).
    tree = parser.parse(text)
    for m in re.finditer(r'"(?:[^"\\\n]|\\.)*"|(#[^\n]*)', text):
        if m.group(1) is not None:
            line = text.count("\n", 0, m.start(1)) + 1
            col = m.start(1) - (text.rfind("\n", 0, m.start(1)) + 1) + 1
            comments.append(Token("COMMENT", m.group(1), m.start(1), line, col))
    return tree


def _too_deep(tree: lark.Tree) -> ast.Span | None:
    """The place of the first subtree nested deeper than MAX_DEPTH, found without recursion."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return _span_of(node.meta)
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, lark.Tree))
    return None


def _offset_of(e: UnexpectedInput, text: str) -> int:
    if isinstance(e, UnexpectedEOF):
        return len(text)
    if isinstance(e, UnexpectedCharacters):
        return e.pos_in_stream
    if isinstance(e, UnexpectedToken):
        if e.token.type == "$END":
            return len(text)
        pos = getattr(e.token, "start_pos", None)
        return pos if pos is not None else len(text)
    return len(text)


def _blank_broken_decl(text: str, offset: int) -> str | None:
    """Replace the declaration holding `offset` by spaces (newlines kept); None when no progress is possible."""
    starts = [m.start(1) for m in _DECL_START.finditer(text) if m.group(1) is not None]
    line_start = text.rfind("\n", 0, offset) + 1
    # A keyword at the error that opens its line starts the next declaration; one mid-line is the error.
    opens_line = text[line_start:offset].strip() == ""
    before = [s for s in starts if s < offset]
    after = [s for s in starts if s > offset or (s == offset and opens_line)]
    start = before[-1] if before else 0
    end = after[0] if after else len(text)
    if end <= start:
        return None
    region = text[start:end]
    blank = re.sub(r"[^\n]", " ", region)
    if blank == region:
        return None
    return text[:start] + blank + text[end:]


def _syntax_diagnostic(src: SourceMap, e: UnexpectedInput, text: str) -> Diagnostic:
    if isinstance(e, UnexpectedCharacters):
        ch = text[e.pos_in_stream] if e.pos_in_stream < len(text) else ""
        message = describe_unexpected_characters(ch, text, e.pos_in_stream)
        span = ast.Span(e.line, e.column, e.line, e.column + 1)
    elif isinstance(e, UnexpectedToken):
        tok = e.token
        message = describe_unexpected_token(tok, set(e.expected))
        if tok.type == "$END":
            line, col = _end_position(text)
            span = ast.Span(line, col, line, col + 1)
        else:
            span = ast.Span(tok.line, tok.column, tok.end_line or tok.line, tok.end_column or tok.column + 1)
    else:  # UnexpectedEOF
        line, col = _end_position(text)
        message = "unexpected end of file"
        span = ast.Span(line, col, line, col + 1)
    return src.error(span, message)


def _end_position(text: str) -> tuple[int, int]:
    """Line and column just after the last non-blank character."""
    stripped = text.rstrip()
    line = stripped.count("\n") + 1
    col = len(stripped) - (stripped.rfind("\n") + 1) + 1
    return line, col


# --- tree → AST --------------------------------------------------------------------------------


def _span_of(meta_or_tok) -> ast.Span:
    if isinstance(meta_or_tok, Token):
        return ast.Span(
            meta_or_tok.line,
            meta_or_tok.column,
            meta_or_tok.end_line or meta_or_tok.line,
            meta_or_tok.end_column or meta_or_tok.column + len(meta_or_tok),
        )
    m = meta_or_tok
    if getattr(m, "empty", True):
        return ast.Span.unknown()
    return ast.Span(m.line, m.column, m.end_line, m.end_column)


def _unquote(tok: Token) -> tuple[str, str | None]:
    """The string's value, and an error message for an unknown escape."""
    body = str(tok)[1:-1]
    out = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            nxt = body[i + 1]
            if nxt not in '"\\':
                return body, f"unknown escape '\\{nxt}' in a string (only \\\" and \\\\ are allowed)"
            out.append(nxt)
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out), None


def _number(tok: Token) -> tuple[int | float, str | None]:
    """The literal's value, and an error message for one that no int64 or finite float holds."""
    text = str(tok)
    if re.fullmatch(r"\d+", text):
        digits = text.lstrip("0")
        if len(digits) > len(str(INT64_MAX)) or int(digits or "0") > INT64_MAX:
            shown = text if len(text) <= 30 else f"{text[:12]}…{text[-6:]} ({len(text)} digits)"
            return 0, f"int literal {shown} is beyond the 64-bit int range (at most {INT64_MAX})"
        return int(text), None
    value = float(text)
    if not math.isfinite(value):
        return 0.0, f"float literal {text[:30]}{'…' * (len(text) > 30)} is beyond the float range (±1.8e308)"
    return value, None


@v_args(meta=True)
class _Builder(Transformer):
    """lark tree → AST dataclasses. Collects keyword-used-as-name errors in `self.errors`."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[tuple[ast.Span, str]] = []

    def _ident(self, tok: Token) -> ast.Ident:
        name = str(tok)
        span = _span_of(tok)
        if name in ast.KEYWORDS:
            self.errors.append((span, f"'{name}' is a keyword and cannot be used as a name"))
        return ast.Ident(name, span)

    # declarations
    def start(self, meta, children):
        return list(children)

    def policy_decl(self, meta, c):
        desc = None
        if c[1] is not None:
            desc, err = _unquote(c[1])
            if err:
                self.errors.append((_span_of(c[1]), err))
        return ast.PolicyDecl(self._ident(c[0]), desc, _span_of(meta))

    def param_decl(self, meta, c):
        return ast.ParamDecl(self._ident(c[0]), self._ident(c[1]), c[2], _span_of(meta))

    def model_decl(self, meta, c):
        return ast.ModelDecl(self._ident(c[0]), c[1], c[2], _span_of(meta))

    def router_decl(self, meta, c):
        return ast.RouterDecl(self._ident(c[0]), c[1], _span_of(meta))

    def fn_decl(self, meta, c):
        args = tuple(a for a in c[1:-1] if a is not None)
        return ast.FnDecl(self._ident(c[0]), args, c[-1], _span_of(meta))

    def fn_arg(self, meta, c):
        return ast.FnArg(self._ident(c[0]), self._ident(c[1]), _span_of(meta))

    def serve_decl(self, meta, c):
        return ast.ServeDecl(c[0], _span_of(meta))

    def entry_decl(self, meta, c):
        return ast.EntryDecl(self._ident(c[0]), _span_of(meta))

    def route_decl(self, meta, c):
        return ast.RouteDecl(self._ident(c[0]), tuple(c[1:]), _span_of(meta))

    def import_decl(self, meta, c):
        kind, value = c[0]
        alias = self._ident(c[1]) if c[1] is not None else None
        if kind == "file":
            return ast.ImportDecl(value, None, alias, _span_of(meta))
        return ast.ImportDecl(None, value, alias, _span_of(meta))

    def import_file(self, meta, c):
        value, err = _unquote(c[0])
        if err:
            self.errors.append((_span_of(c[0]), err))
        return ("file", value)

    def import_std(self, meta, c):
        if str(c[0]) != "stdlib":
            self.errors.append(
                (
                    _span_of(c[0]),
                    f"unknown import root '{c[0]}'; write `import stdlib.NAME` or `import \"FILE.tr\"`",
                )
            )
        self._ident(c[1])
        return ("stdlib", str(c[1]))

    def options(self, meta, c):
        return tuple(o for o in c if o is not None)

    def option(self, meta, c):
        return ast.Option(self._ident(c[0]), c[1], _span_of(meta))

    def auto(self, meta, c):
        return ast.Auto(_span_of(meta))

    def rule(self, meta, c):
        _when, cond, _arrow, target, drop, for_k = c
        return ast.Rule(cond, self._ident(target), drop is not None, for_k, _span_of(meta))

    def for_clause(self, meta, c):
        return c[0]

    # expressions
    def or_(self, meta, c):
        return ast.Binary("or", c[0], c[1], _span_of(meta))

    def and_(self, meta, c):
        return ast.Binary("and", c[0], c[1], _span_of(meta))

    def not_(self, meta, c):
        return ast.Unary("not", c[0], _span_of(meta))

    def compare(self, meta, c):
        return ast.Binary(str(c[1]), c[0], c[2], _span_of(meta))

    def binary(self, meta, c):
        return ast.Binary(str(c[1]), c[0], c[2], _span_of(meta))

    def in_(self, meta, c):
        return ast.In(c[0], c[1], _span_of(meta))

    def neg(self, meta, c):
        return ast.Unary("-", c[1], _span_of(meta))

    def number(self, meta, c):
        value, err = _number(c[0])
        if err:
            self.errors.append((_span_of(c[0]), err))
        return ast.Number(value, str(c[0]), _span_of(c[0]))

    def string(self, meta, c):
        value, err = _unquote(c[0])
        if err:
            self.errors.append((_span_of(c[0]), err))
        return ast.String(value, _span_of(c[0]))

    def true(self, meta, c):
        return ast.Bool(True, _span_of(meta))

    def false(self, meta, c):
        return ast.Bool(False, _span_of(meta))

    def name(self, meta, c):
        parts = tuple(str(t) for t in c if t is not None)
        for t in c:
            if t is not None:
                self._ident(t)
        return ast.Name(parts, _span_of(meta))

    def call(self, meta, c):
        args = tuple(a for a in c[1:] if a is not None)
        return ast.Call(c[0], args, _span_of(meta))

    def list(self, meta, c):
        return ast.ListExpr(tuple(a for a in c if a is not None), _span_of(meta))
