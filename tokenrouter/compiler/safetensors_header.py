"""Read a safetensors file's header (tensor names, dtypes, shapes, metadata) without loading tensors."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

MAX_HEADER = 100 * 1024 * 1024


class HeaderError(Exception):
    pass


def read_header(path: str | Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(tensors: name -> {"dtype", "shape"}, metadata). HeaderError for a file that is not safetensors."""
    p = Path(path)
    with p.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise HeaderError(f"{p}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise HeaderError(f"{p}: not a safetensors file (header length {n})")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise HeaderError(f"{p}: not a safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{p}: not a safetensors file (bad header)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise HeaderError(f"{p}: not a safetensors file (__metadata__ is not an object of strings)")
    return _tensors(p, header), metadata


def _tensors(p: Path, header: dict) -> dict[str, dict[str, Any]]:
    """The header's tensor entries: name -> {"dtype", "shape"}, each checked."""
    tensors: dict[str, dict[str, Any]] = {}
    for name, info in header.items():
        shape = info.get("shape") if isinstance(info, dict) else None
        if (
            not isinstance(shape, list)
            or not all(_dim(x) for x in shape)
            or not isinstance(info.get("dtype"), str)
        ):
            raise HeaderError(f"{p}: not a safetensors file (bad entry for '{name}')")
        tensors[name] = {"dtype": info.get("dtype"), "shape": shape}
    return tensors


def _dim(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0
