"""Diagnostics: `FILE:LINE:COL: error: MESSAGE`, the source line, and a caret under the span.

Every user-facing problem in a .tr file (syntax, names, types, checks) becomes a `Diagnostic`; nothing
in dsl/ or compiler/ raises for a user's mistake. `render_all` caps a long list with "… and N more".
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tokenrouter.dsl.ast import Span

ERROR = "error"
WARNING = "warning"
MAX_CANDIDATES = 1000


@dataclass(frozen=True, slots=True)
class Diagnostic:
    severity: str  # "error" | "warning"
    file: str
    line: int  # 1-based; 0 when the problem has no place in the file
    col: int
    message: str
    end_line: int = 0
    end_col: int = 0
    source_line: str | None = None  # the text of `line`, for the caret display

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def header(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}" if self.line > 0 else self.file
        return f"{where}: {self.severity}: {self.message}"

    def render(self) -> str:
        """The header, then (when the place is known) the source line and a `^~~~` caret under the span."""
        out = [self.header()]
        if self.source_line is not None and self.line > 0:
            text = self.source_line.rstrip("\n")
            out.append(text)
            start = max(self.col - 1, 0)
            if self.end_line == self.line and self.end_col > self.col:
                width = self.end_col - self.col
            else:
                width = max(len(text.rstrip()) - start, 1)
            prefix = "".join(ch if ch == "\t" else " " for ch in text[:start])
            out.append(prefix + "^" + "~" * (width - 1))
        return "\n".join(out)


class SourceMap:
    """Maps a file name to its text lines, so diagnostics can quote the line they point at."""

    def __init__(self, file: str, text: str) -> None:
        self.file = file
        self.lines = text.splitlines()

    def line(self, n: int) -> str | None:
        return self.lines[n - 1] if 1 <= n <= len(self.lines) else None

    def make(self, severity: str, span: Span | None, message: str) -> Diagnostic:
        if span is None or span.line <= 0:
            return Diagnostic(severity, self.file, 0, 0, message)
        return Diagnostic(
            severity,
            self.file,
            span.line,
            span.col,
            message,
            end_line=span.end_line,
            end_col=span.end_col,
            source_line=self.line(span.line),
        )

    def error(self, span: Span | None, message: str) -> Diagnostic:
        return self.make(ERROR, span, message)

    def warning(self, span: Span | None, message: str) -> Diagnostic:
        return self.make(WARNING, span, message)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`" (did you mean 'x'?)"` when a close match exists, else `""`. Among thousands of names, only those of
    about the same length, at most MAX_CANDIDATES of them, are compared (each comparison is slow)."""
    pool = sorted(set(candidates))
    if len(pool) > MAX_CANDIDATES:
        pool = [c for c in pool if abs(len(c) - len(name)) <= 2][:MAX_CANDIDATES]
    close = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def sort_key(d: Diagnostic) -> tuple[str, int, int]:
    return (d.file, d.line, d.col)


def render_all(diagnostics: Sequence[Diagnostic], limit: int = 50) -> str:
    """Render errors and warnings in source order, at most `limit` of them, then '… and N more'."""
    ordered = sorted(diagnostics, key=sort_key)
    shown = [d.render() for d in ordered[:limit]]
    if len(ordered) > limit:
        shown.append(f"… and {len(ordered) - limit} more")
    return "\n".join(shown)
