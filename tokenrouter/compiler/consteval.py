"""Compile-time evaluation of constant expressions: param defaults, options, paths, `for K`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tokenrouter.compiler.program import Unit
from tokenrouter.compiler.scope import lookup
from tokenrouter.dsl import ast
from tokenrouter.dsl.limits import value_problem


class ConstError(Exception):
    def __init__(self, span: ast.Span, message: str) -> None:
        super().__init__(message)
        self.span = span
        self.message = message


def type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return "auto"


ParamGetter = Callable[[Unit, ast.ParamDecl, ast.Span], Any]


def evaluate(expr: ast.Expr, unit: Unit, param: ParamGetter) -> Any:
    """The value of a constant expression; `param(unit, decl, span)` gives a param's value."""
    match expr:
        case ast.Number(value=v) | ast.String(value=v) | ast.Bool(value=v):
            return v
        case ast.Auto():
            return "auto"
        case ast.ListExpr(items=items):
            return [evaluate(i, unit, param) for i in items]
        case ast.Name():
            return _param_value(expr, unit, param)
        case ast.Unary(op=op, operand=x) if op in ("-", "not"):
            return _unary(expr, op, evaluate(x, unit, param))
        case ast.Binary(op=op, left=lhs, right=rhs):
            return _checked(expr, _binary(expr, op, evaluate(lhs, unit, param), evaluate(rhs, unit, param)))
        case ast.In(left=lhs, items=items):
            v = evaluate(lhs, unit, param)
            return any(v == i for i in evaluate(items, unit, param))
        case ast.Call(func=f, args=args) if f.dotted in ("min", "max", "abs", "log", "exp", "sigmoid"):
            vals = [evaluate(a, unit, param) for a in args]
            if any(type_of(v) not in ("int", "float") for v in vals) or not vals:
                raise ConstError(expr.span, f"'{f.dotted}' needs numbers")
            return _checked(expr, _call(expr, f.dotted, vals))
        case _:
            raise ConstError(expr.span, "expected a constant (a literal or a param)")


def _param_value(expr: ast.Name, unit: Unit, param: ParamGetter) -> Any:
    """The value of the param a name refers to (a ConstError for any other name)."""
    ref = lookup(unit, expr)
    if ref is None:
        raise ConstError(expr.span, f"unknown name '{expr.dotted}'")
    if ref.kind != "param":
        raise ConstError(
            expr.span,
            f"'{expr.dotted}' is a {ref.kind}, not a constant; only params and literals are allowed here",
        )
    return param(ref.unit, ref.decl, expr.span)


def _unary(expr: ast.Unary, op: str, v: Any) -> Any:
    """`-v` of a number or `not v` of a bool."""
    if op == "-":
        if type_of(v) not in ("int", "float"):
            raise ConstError(expr.span, f"'-' needs a number, not {type_of(v)}")
        return _checked(expr, -v)
    if type_of(v) != "bool":
        raise ConstError(expr.span, f"'not' needs a bool, not {type_of(v)}")
    return not v


def _checked(expr: ast.Expr, value: Any) -> Any:
    """`value`, unless no plan can hold it (an int beyond int64, an infinite float): then a ConstError."""
    problem = value_problem(value)
    if problem is not None:
        raise ConstError(expr.span, f"out of range: {problem}")
    return value


def _binary(expr: ast.Binary, op: str, a: Any, b: Any) -> Any:
    ta, tb = type_of(a), type_of(b)
    num = ("int", "float")
    if op in ("and", "or"):
        if ta != "bool" or tb != "bool":
            raise ConstError(expr.span, f"'{op}' needs bools, not {ta} and {tb}")
        return (a and b) if op == "and" else (a or b)
    if op in ("==", "!="):
        if not (ta == tb or (ta in num and tb in num)):
            raise ConstError(expr.span, f"cannot compare {ta} with {tb}")
        return (a == b) if op == "==" else (a != b)
    if ta not in num or tb not in num:
        raise ConstError(expr.span, f"'{op}' needs numbers, not {ta} and {tb}")
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            raise ConstError(expr.span, "division by zero")
        return a / b
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _call(expr: ast.Call, name: str, vals: list[Any]) -> Any:
    if name in ("min", "max"):
        if len(vals) < 2:
            raise ConstError(expr.span, f"'{name}' takes at least 2 arguments")
        return min(vals) if name == "min" else max(vals)
    if len(vals) != 1:
        raise ConstError(expr.span, f"'{name}' takes 1 argument")
    (v,) = vals
    if name == "abs":
        return abs(v)
    if name == "log":
        if v <= 0:
            raise ConstError(expr.span, "log of a number ≤ 0")
        return math.log(v)
    if name == "exp":
        try:
            return math.exp(v)
        except OverflowError:
            raise ConstError(expr.span, "exp overflows") from None
    return 1.0 / (1.0 + math.exp(-v)) if v > -700 else 0.0
