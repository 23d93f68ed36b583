"""Model and router paths: relative to the file that names them; a hub id is kept as written."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from tokenrouter.hub import is_hub_id as looks_like_hub_id


def resolve_source_path(written: str, base: Path) -> tuple[str, bool]:
    """(path for the plan, exists). Existing or clearly local paths become absolute; an absent
    `org/name` is kept as written (a hub id)."""
    p = Path(written).expanduser()
    full = p if p.is_absolute() else base / p
    if full.exists():
        return str(full.resolve()), True
    if looks_like_hub_id(written):
        return written, False
    return str(full.resolve()), False


def relative_to_plan(path: str, plan_dir: Path) -> str:
    """An absolute path as stored in a plan: relative to the plan's directory. Hub ids stay as they are."""
    if not os.path.isabs(path):
        return path
    return os.path.relpath(path, plan_dir.resolve())


def absolute_from_plan(path: str, plan_dir: Path) -> str:
    """A plan's stored path as an absolute path (a hub id that is not a local folder stays as it is)."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return str(p)
    full = plan_dir.resolve() / p
    if full.exists() or not looks_like_hub_id(path):
        return str(full.resolve())
    return path


def shown(path: str | Path) -> str:
    """A path for messages: relative to the working directory when it lies below it, else absolute."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(p)


def file_problem(path: str | Path) -> str | None:
    """Why `path` cannot be read as an input file (a `.tr` policy, a plan): "no such file", "is a directory,
    not a file", …; None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "no such file"
    except OSError as e:
        return f"cannot read: {e.strerror or e}"
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    return None


def files_problem(paths: Iterable[str | Path]) -> str | None:
    """`PATH: problem` for the first of `paths` that is not a regular file (see `file_problem`); None if all are."""
    for path in paths:
        problem = file_problem(path)
        if problem is not None:
            return f"{path}: {problem}"
    return None
