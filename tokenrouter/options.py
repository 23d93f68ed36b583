"""Command-line values shared by several commands' modules: `NAME=VALUE` options (`-D`, `--remote`, `--batch`,
…) as a dict. A malformed one raises `ValueError` with the message the command line shows (a usage error)."""

from __future__ import annotations

from collections.abc import Callable


def name_values(
    values: list[str] | None, flag: str, shape: str, valid: Callable[[str], bool] = lambda value: True
) -> dict[str, str]:
    """`FLAG NAME=VALUE` options as a dict (names stripped, values as given); one without `=`, without a name
    or whose value fails `valid` raises `ValueError` naming the expected `shape`."""
    out: dict[str, str] = {}
    for item in values or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not valid(value):
            raise ValueError(f"bad {flag} '{item}': expected {shape}")
        out[name.strip()] = value
    return out


def defines(values: list[str] | None) -> dict[str, str]:
    """`-D NAME=VALUE` options as a dict."""
    return name_values(values, "-D", "NAME=VALUE")
