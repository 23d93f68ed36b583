"""Reading a `.tr` source: at most `MAX_SOURCE_BYTES`, UTF-8, every problem a diagnostic (a bad byte at its line
and column), never an exception."""

from __future__ import annotations

import os
from pathlib import Path

from tokenrouter.dsl.diagnostics import Diagnostic

MAX_SOURCE_BYTES = 256 * 1024  # a policy is a few KiB; the parser takes seconds per MiB


def too_large(size: int) -> str | None:
    """The message for a source of `size` bytes beyond the cap; None when it is within."""
    if size <= MAX_SOURCE_BYTES:
        return None
    return f"the file is {size:,} bytes; a policy source is at most {MAX_SOURCE_BYTES // 1024} KiB"


def read_source(path: str | Path, shown: str) -> tuple[str | None, Diagnostic | None]:
    """(text, None), or (None, the diagnostic that says why the file at `path` cannot be a source); `shown`
    names the file in the diagnostic."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
            size = (
                len(data) if len(data) <= MAX_SOURCE_BYTES else max(os.fstat(f.fileno()).st_size, len(data))
            )
    except FileNotFoundError:
        return None, Diagnostic("error", shown, 0, 0, "no such file")
    except IsADirectoryError:
        return None, Diagnostic("error", shown, 0, 0, "is a directory, not a file")
    except (OSError, ValueError) as e:
        return None, Diagnostic(
            "error", shown, 0, 0, f"cannot read file: {getattr(e, 'strerror', None) or e}"
        )
    problem = too_large(size)
    if problem is not None:
        return None, Diagnostic("error", shown, 0, 0, problem)
    return decode_source(data, shown)


def decode_source(data: bytes, shown: str) -> tuple[str | None, Diagnostic | None]:
    """`data` as UTF-8 text, or the diagnostic at the line and column of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        line_end = data.find(b"\n", e.start)
        line_bytes = data[line_start : line_end if line_end >= 0 else len(data)]
        col = len(data[line_start : e.start].decode("utf-8", errors="replace")) + 1
        line = data.count(b"\n", 0, e.start) + 1
        message = f"not UTF-8 text: byte 0x{data[e.start]:02x} ({e.reason}); save the file as UTF-8"
        source_line = line_bytes.decode("utf-8", errors="replace")
        return None, Diagnostic("error", shown, line, col, message, line, col + 1, source_line)
