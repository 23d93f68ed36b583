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
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise HeaderError(f"{p}: not a safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{p}: not a safetensors file (bad header)")
    metadata = header.pop("__metadata__", None) or {}
    tensors: dict[str, dict[str, Any]] = {}
    for name, info in header.items():
        if not isinstance(info, dict) or not isinstance(info.get("shape"), list):
            raise HeaderError(f"{p}: not a safetensors file (bad entry for '{name}')")
        tensors[name] = {"dtype": info.get("dtype"), "shape": [int(x) for x in info["shape"]]}
    return tensors, metadata
