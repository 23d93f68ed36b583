"""Teacher-forced rows kept on disk (`train-router --cache DIR`), so that runs which differ only in the
router's training settings do not run both models over the text again (all 674k positions of the demo
corpus's `router` part take ~26 min of teacher forcing on a shared CPU, one epoch of training ~15 s).

A cache entry is one file, ``DIR/<key>.pt``; the key is a SHA-256 over everything the rows depend on:
the windows' token ids and file names (so the text, the tokenizer, ``seq_len``, ``max_tokens`` and the
window sample), ``prompt``, the models' names and the bytes of every file in their folders, the entry
model, the inputs of the routers whose values are collected, and whether the expected-gain columns are. Anything else (label, loss, epochs, lr,
hidden sizes, split seed) is computed from the rows, so it may change freely between runs. Rows are
stored exactly (float32), ~1 GB for 674k positions of R2R's 356 inputs.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import fields
from pathlib import Path

import torch

from .policy_view import PolicyViewError
from .teacher import TeacherConfig, TeacherData, Window, teacher_force

VERSION = 1  # bump when TeacherData's rows change meaning


def _folder_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode() + b"\0")
            with p.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def cache_key(plan: dict, entry: str, models: list[str], windows: list[Window], cfg: TeacherConfig,
              routers: dict, expected: bool = False) -> str:  # fmt: skip
    h = hashlib.sha256()
    head: dict = {
        "version": VERSION,
        "prompt": cfg.prompt,
        "entry": entry,
        "models": {m: _folder_digest(Path(plan["models"][m]["path"])) for m in models},
        "routers": {n: [i.text() for i in s.inputs] for n, s in sorted(routers.items())},
    }
    if expected:  # (absent otherwise: the keys of entries without these columns stay as they were)
        head["expected"] = True
    h.update(json.dumps(head, sort_keys=True).encode())
    for w in windows:
        h.update(w.file.encode() + b"\0")
        h.update(torch.tensor(w.ids, dtype=torch.int32).numpy().tobytes())
    return h.hexdigest()[:24]


def _to_dict(data: TeacherData) -> dict:
    return {f.name: getattr(data, f.name) for f in fields(TeacherData)}


def _read_entry(path: Path) -> TeacherData:
    try:
        rows = torch.load(path, weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise PolicyViewError(f"cache entry {path} is unreadable ({exc}); delete it to recompute") from None
    return TeacherData(**rows)


def teacher_force_cached(
    cache_dir: Path | None,
    plan: dict,
    entry: str,
    models: list[str],
    windows: list[Window],
    cfg: TeacherConfig,
    routers: dict,
    expected: bool = False,
) -> tuple[TeacherData, str]:
    """``teacher_force``'s rows, read from ``cache_dir`` when an entry with the same key is there, else
    computed and written there. Returns (rows, 'hit PATH' | 'wrote PATH' | 'off')."""
    if cache_dir is None:
        return teacher_force(plan, entry, models, windows, cfg, routers, expected), "off"
    path = Path(cache_dir) / f"{cache_key(plan, entry, models, windows, cfg, routers, expected)}.pt"
    if path.exists():
        return _read_entry(path), f"hit {path}"
    data = teacher_force(plan, entry, models, windows, cfg, routers, expected)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(_to_dict(data), tmp)
    tmp.replace(path)  # a run stopped mid-write leaves no entry that looks complete
    return data, f"wrote {path}"
