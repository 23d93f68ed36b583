"""How `tokenrouter --help` names parameters: arguments in capitals (`FILE`, `PLAN`, `FILES...`; `[OUT]` when
optional), flags without a type, an option's value by its type (`INTEGER`, `FLOAT`, `TEXT`). Typer's own help
tags every parameter with its Python type (`--help <bool>`, `-D <list[str]>`) and writes required arguments
as `{file}` in the usage line.

`App` makes its group and commands with `Group` and `Command`, which restyle each parameter as `get_params`
hands it to the help, the usage line and the parser (`restyle`: idempotent)."""

from __future__ import annotations

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

TYPE_NAMES = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "bool": "BOOLEAN", "Path": "PATH"}


class _Argument(TyperArgument):
    """An argument whose usage piece is its metavar, bracketed when optional, and whose help has no type."""

    def display_type_rich(self, ctx) -> str | None:
        return None

    def get_usage_pieces(self, ctx) -> list[str]:
        return [self.metavar if self.required else f"[{self.metavar}]"]


def value_name(option: TyperOption, ctx) -> str | None:
    """`INTEGER` for typer's `<int>`, `<int range>` and `<list[int]>`; `a|b` for a choice. None with a typer
    whose help names types as click does (no `display_type_rich`)."""
    typed = getattr(TyperOption, "display_type_rich", None)
    if typed is None:
        return None
    label = (typed(option, ctx) or "").strip("<>.")
    if label.startswith("list[") and label.endswith("]"):
        label = label[len("list[") : -1]
    label = label.removesuffix(" range")
    return TYPE_NAMES.get(label, label.upper() if label.isidentifier() else label)


def restyle(param, ctx) -> None:
    if isinstance(param, TyperArgument) and not isinstance(param, _Argument):
        if param.metavar is None:
            param.metavar = param.name.upper() + ("..." if param.nargs != 1 else "")
        param.__class__ = _Argument
    elif isinstance(param, TyperOption) and param.metavar is None:
        param.metavar = "" if param.is_flag or param.count else value_name(param, ctx)


class Command(TyperCommand):
    def get_params(self, ctx) -> list:
        params = super().get_params(ctx)
        for param in params:
            restyle(param, ctx)
        return params


class Group(TyperGroup):
    def get_params(self, ctx) -> list:
        params = super().get_params(ctx)
        for param in params:
            restyle(param, ctx)
        return params


class App(typer.Typer):
    """A `typer.Typer` whose group and commands name their parameters as above."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cls=Group, **kwargs)

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or Command, **kwargs)
