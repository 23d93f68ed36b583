"""Writing the files a command produces (plans, profiles) without losing the user's: one writer for all of them.

`write_replacing` writes the whole text to a temporary file beside the target and renames it over the target, so
that a reader never sees half a file. It refuses what would lose something: the command's own input, a policy
source (`.tr`: a plan or profile written over one replaces the user's program), and anything at the path that is
not a regular file (a folder, a FIFO, a device). A symbolic link is written through: its target gets the text,
the link stays. The temporary file is removed if the write fails.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterable
from pathlib import Path


class OutputPathError(OSError):
    """The output path would lose the user's data; the message says why (callers report it as `cannot write`)."""


def check_output(path: str | Path, inputs: Iterable[str | Path] = ()) -> Path:
    """The path the text would land at (a link's target), after the checks `write_replacing` makes."""
    p = Path(path)
    target = p.resolve()
    if p.suffix == ".tr" or target.suffix == ".tr":
        raise OutputPathError(
            f"{p} is a policy source (.tr): writing there would replace it; give another path"
        )
    for given in inputs:
        if Path(given).resolve() == target:
            raise OutputPathError(f"{p} is this command's input {given}: give another output path")
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        if not target.parent.is_dir():
            raise OutputPathError(f"no folder {target.parent}") from None
        return target
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise OutputPathError(f"{p} is {kind}")
    return target


def write_replacing(path: str | Path, text: str, inputs: Iterable[str | Path] = ()) -> Path:
    """Write `text` to `path` (through a link to its target) by a rename over it; return where it landed."""
    target = check_output(path, inputs)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def finite_json(x):
    """`x` with every NaN or infinite float (a percentile of nothing, a latency no request measured) as None, so that
    `json.dumps` writes null, which JSON readers other than Python's accept, instead of NaN."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    return x
