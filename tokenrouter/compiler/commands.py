"""The work of the language commands (`check`, `fmt`, `inspect`): each function returns the text to print and
raises for a user's mistake; `tokenrouter.cli` prints it and turns the error into a message and an exit status."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def plural(n: int, word: str) -> str:
    """`1 error`, `2 errors`."""
    return f"{n} {word}{'s' * (n != 1)}"


@dataclass(slots=True)
class Checked:
    """One file's `check`: its rendered diagnostics (None without any), the summary line, and whether it has
    errors (the summary then goes to stderr and the command exits 1)."""

    diagnostics: str | None
    summary: str
    failed: bool


def check_file(path: str, defines: dict[str, str], weights_check: bool, max_errors: int) -> Checked:
    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.dsl.diagnostics import render_all

    result = compile_file(path, defines, weights_check=weights_check)
    shown = render_all(result.diagnostics, limit=max_errors) if result.diagnostics else None
    n_err, n_warn = len(result.errors), len(result.diagnostics) - len(result.errors)
    if n_err:
        return Checked(shown, f"{path}: {plural(n_err, 'error')}, {plural(n_warn, 'warning')}", True)
    return Checked(shown, f"{path}: ok" + (f" ({plural(n_warn, 'warning')})" if n_warn else ""), False)


@dataclass(slots=True)
class Formatted:
    """One file's `fmt`: the line to print (None: nothing to say), whether it goes to stderr, and whether the
    command is to exit 1 for it (unreadable, does not parse, or would change under --check)."""

    message: str | None
    to_stderr: bool = False
    failed: bool = False


def format_file(path: str, check_only: bool) -> Formatted:
    """Format one policy in place (or, with `check_only`, only say whether it would change)."""
    from tokenrouter.dsl.diagnostics import render_all
    from tokenrouter.dsl.formatter import format_module
    from tokenrouter.dsl.parser import parse

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return Formatted(f"{path}: error: cannot read file: {exc}", True, True)
    result = parse(text, path)
    if result.module is None:
        return Formatted(render_all(result.diagnostics), True, True)
    formatted = format_module(result.module)
    if formatted == text:
        return Formatted(None)
    if check_only:
        return Formatted(f"{path}: would reformat", failed=True)
    Path(path).write_text(formatted, encoding="utf-8")
    return Formatted(f"reformatted {path}")


def inspect_text(plan: dict, as_json: bool, kernels: bool, sampler: str | None) -> Iterator[str]:
    """What `inspect` prints, piece by piece: each model's route kernels (`--kernels`), the plan as JSON, or
    its summary. A kernel that does not render raises `RouteIRError` or `ValueError` after the ones before it."""
    from tokenrouter.compiler.summary import render

    if kernels:
        yield from kernel_sources(plan, sampler)
    elif as_json:
        yield json.dumps(plan, indent=2, ensure_ascii=False)
    else:
        yield render(plan)


def kernel_sources(plan: dict, sampler: str | None = None) -> Iterator[str]:
    """The torch and Triton source rendered from each model's route IR, each after a header line (`sampler`:
    None = the default one)."""
    from tokenrouter.compiler.kernels import BACKENDS, DEFAULT_SAMPLER, render_route_kernel

    sampler = DEFAULT_SAMPLER if sampler is None else sampler
    for model, ir in plan["routes"].items():
        for backend in BACKENDS:
            source = render_route_kernel(ir, backend, model, sampler=sampler)
            yield f"# ===== model {model}: {backend} route kernel ====="
            yield source
