"""Syntax errors in words: map lark's unexpected token and expected-terminal set to a sentence."""

from __future__ import annotations

from lark import Token

from tokenrouter.dsl.ast import KEYWORDS

WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "ARROW": "'->'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "COLON": "':'",
    "COMMA": "','",
    "EQUAL": "'='",
    "DOT": "'.'",
    "AUTO": "'auto'",
    "WHEN": "'when'",
    "DROP": "'drop'",
    "FOR": "'for'",
    "AS": "'as'",
    "IN": "'in'",
    "AND": "'and'",
    "OR": "'or'",
    "NOT": "'not'",
    "TRUE": "'true'",
    "FALSE": "'false'",
    "MINUS": "'-'",
    "PLUS": "'+'",
    "MUL_OP": "'*' or '/'",
    "COMP_OP": "a comparison",
    "$END": "end of file",
}
DECLS = {"POLICY", "PARAM", "MODEL", "ROUTER", "FN", "SERVE", "ENTRY", "ROUTE", "IMPORT"}
EXPR_START = {"NUMBER", "STRING", "NAME", "LPAR", "LSQB", "MINUS", "TRUE", "FALSE", "NOT"}
OPERATORS = {"PLUS", "MINUS", "MUL_OP", "COMP_OP", "AND", "OR", "IN"}


def _show(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    return f"'{tok.value}'"


def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]


def describe_expected(expected: set[str]) -> str:
    parts: list[str] = []
    rest = set(expected)
    if EXPR_START - {"NOT"} <= rest:
        parts.append("an expression")
        rest -= EXPR_START
    if DECLS <= rest:
        parts.append("a declaration (policy, param, model, router, fn, serve, entry, route, import)")
        rest -= DECLS
    if {"WHEN", "ARROW"} <= rest:
        parts.append("a rule ('when COND -> MODEL' or '-> MODEL')")
        rest -= {"WHEN", "ARROW"}
    if rest & OPERATORS and len(rest) > 3:
        rest -= OPERATORS
        rest.discard("MINUS")
        parts.append("an operator")
    order = sorted(rest, key=lambda t: (t == "$END", WORDS.get(t, t)))
    parts = [WORDS.get(t, f"'{t.lower()}'") for t in order] + parts
    return _join(parts) if parts else "something else"


def describe_unexpected_token(tok: Token, expected: set[str]) -> str:
    value = str(tok.value) if tok.type != "$END" else ""
    if value in KEYWORDS and "NAME" in expected and not (EXPR_START - {"NOT"}) <= expected:
        return f"'{value}' is a keyword and cannot be used as a name"
    if tok.type == "COMP_OP" and "COMP_OP" not in expected and ({"AND", "OR"} & expected):
        return "comparisons cannot be chained; combine them with 'and'"
    if tok.type == "EQUAL" and ("COMP_OP" in expected or "AND" in expected):
        return "unexpected '='; use '==' to compare"
    if tok.type == "NAME" and "COMMA" in expected and "RBRACE" in expected:
        return f"unexpected {_show(tok)}; expected ',' or '}}' (options are separated by commas)"
    return f"unexpected {_show(tok)}; expected {describe_expected(expected)}"


def describe_unexpected_characters(ch: str, text: str, pos: int) -> str:
    two = text[pos : pos + 2]
    if ch == '"':
        return "unterminated string (a string ends with '\"' on the same line)"
    if two in ("&&", "||"):
        return f"unexpected '{two}'; write '{'and' if two == '&&' else 'or'}'"
    if ch == "!":
        return "unexpected '!'; write 'not' (or '!=' to compare)"
    if ch == "'":
        return 'unexpected "\'"; strings use double quotes'
    shown = ch if ch.isprintable() else repr(ch)
    return f"unexpected character '{shown}'"
