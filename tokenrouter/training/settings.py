"""Checks of the training commands' settings made before any work (`train_router`, `evaluate`): the error they
raise and the file and folder checks they share."""

from __future__ import annotations

from pathlib import Path


class TrainSettingsError(ValueError):
    """Settings that cannot teacher-force or train (a router too large, sequences over the context, a --cache that
    is no folder): `train_router` and `evaluate` raise it before any work, and the commands call it a usage
    error."""


def output_problem(path: Path, what: str = "-o") -> str | None:
    """The message when a file cannot be written at `path` (a folder is there, or what would be its folder is a
    file), else None: checked before the work whose result goes there."""
    path = Path(path)
    if path.is_dir():
        return f"{what} {path}: is a folder; give a file name"
    return folder_problem(path.parent, what, path)


def folder_problem(folder: Path, what: str, named: Path | None = None) -> str | None:
    """The message when `folder` cannot be a folder (it, or one above it, is a file), else None (a folder is
    made where none is)."""
    for up in (Path(folder), *Path(folder).parents):
        if up.exists():
            return None if up.is_dir() else f"{what} {named or folder}: {up} is a file, not a folder"
    return None
