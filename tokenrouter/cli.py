"""The `tokenrouter` command line.

Each command is a thin wrapper: it parses arguments, calls into the package, prints, and maps user
mistakes to exit status 1 (errors in the input) or 2 (bad usage). Heavy imports (torch, the runtime)
happen inside the commands so that `tokenrouter check` starts fast.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="tokenrouter",
    help="Token-level LLM routing: check, compile and serve .tr policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
