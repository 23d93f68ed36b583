"""Model and router paths: relative to the file that names them; a hub id is kept as written."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from tokenrouter.hub import is_hub_id as looks_like_hub_id


def local_path(written: str, base: Path) -> Path:
    """`written` with `~` expanded, relative to `base` unless absolute. ValueError with a message for a path no
    file can have: a NUL byte, `~NAME/` of an unknown user, a name longer than the system takes."""
    if "\0" in written:
        raise ValueError("a path cannot contain a NUL byte")
    try:
        p = Path(written).expanduser()
    except RuntimeError:
        raise ValueError(f"cannot expand '{written.split('/')[0]}': no such user") from None
    full = p if p.is_absolute() else base / p
    try:
        full.stat()
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise ValueError(f"path too long for this system ({len(written)} characters)") from None
    return full


def _exists(p: Path) -> bool:
    try:
        p.stat()
    except OSError:
        return False
    return True


def resolve_source_path(written: str, base: Path) -> tuple[str, bool]:
    """(path for the plan, exists). Existing or clearly local paths become absolute; an absent
    `org/name` is kept as written (a hub id) unless a folder `org` is there (then it is a local path with a
    typo in it). ValueError for a path no file can have (`local_path`)."""
    full = local_path(written, base)
    if _exists(full):
        return str(full.resolve()), True
    if looks_like_hub_id(written) and not full.parent.is_dir():
        return written, False
    return str(full.resolve()), False


def relative_to_plan(path: str, plan_dir: Path) -> str:
    """An absolute path as stored in a plan: relative to the plan's directory. Hub ids stay as they are."""
    if not os.path.isabs(path):
        return path
    return os.path.relpath(path, plan_dir.resolve())


def absolute_from_plan(path: str, plan_dir: Path) -> str:
    """A plan's stored path as an absolute path (a hub id that is not a local folder stays as it is).
    ValueError for a path no file can have (`local_path`)."""
    full = local_path(path, plan_dir.resolve())
    if os.path.isabs(os.path.expanduser(path)):
        return str(full)
    if _exists(full) or not looks_like_hub_id(path):
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
    except ValueError:
        return "a path cannot contain a NUL byte"
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


def near_miss(path: str | Path) -> str:
    """`" (did you mean 'PATH'?)"` for a missing `path` when its deepest existing folder holds a name close to
    the first missing part of it (a typo in a folder or file name), else `""`."""
    import difflib

    p = Path(path)
    missing = p
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    folder = missing.parent
    try:
        names = sorted(x.name for x in folder.iterdir())
    except OSError:
        return ""
    close = difflib.get_close_matches(missing.name, names, n=1, cutoff=0.8)
    if not close:
        return ""
    return f" (did you mean '{shown(folder / close[0] / p.relative_to(missing))}'?)"
