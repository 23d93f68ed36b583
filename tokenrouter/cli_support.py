"""What the modules of the command line (`cli.py`, `cli_training.py`, `cli_throughput.py`) share: the one way a
user's mistake becomes a message on stderr and an exit status (1: errors in the input, 2: bad usage), and the
checks of arguments several commands take."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer


def fail(message: str, code: int) -> NoReturn:
    """Print `message` on stderr and exit with `code`."""
    typer.echo(message, err=True)
    raise typer.Exit(code)


@contextmanager
def user_errors(*rules: tuple) -> Iterator[None]:
    """Run the block; an exception that matches a rule `(types, code)` or `(types, code, prefix)`, tried in order,
    prints `PREFIX MESSAGE` (prefix "error: " unless given) and exits with `code`. Anything else propagates."""
    try:
        yield
    except typer.Exit:
        raise
    except Exception as exc:
        for types, code, *prefix in rules:
            if isinstance(exc, types):
                fail(f"{prefix[0] if prefix else 'error: '}{exc}", code)
        raise


def defines(values: list[str] | None) -> dict[str, str]:
    """`-D NAME=VALUE` options as a dict; a malformed one is a usage error (exit 2)."""
    from tokenrouter.options import defines as parse

    with user_errors((ValueError, 2)):
        return parse(values)


def require_files(paths: list[str]) -> None:
    """Exit 2 naming the first path that is not a regular file, and why (`compiler.paths.file_problem`)."""
    from tokenrouter.compiler.paths import files_problem

    if problem := files_problem(paths):
        fail(f"error: {problem}", 2)
