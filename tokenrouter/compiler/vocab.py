"""Models of a policy share one tokenizer: a token id that one model writes is the next model's input. Two
model folders agree when their config.json `vocab_size` (the width of the logits a model samples from) is
the same and, where both have a tokenizer.json, the tokenizer is the same. A tokenizer's identity is the
sha256 of its tokenizer.json's `model` (type, vocabulary, merges) and `added_tokens` sections: the token ids
and what they stand for, not settings such as padding or truncation that a re-save may change."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tokenrouter.compiler.paths import shown


@dataclass(frozen=True, slots=True)
class Vocab:
    folder: str
    size: int | None  # config.json vocab_size
    tokenizer: str | None  # identity of tokenizer.json (module docstring); None without one


def read_vocab(folder: str | Path) -> Vocab | None:
    """What a model folder says of its vocabulary; None where there is no readable config.json."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    return Vocab(str(folder), size if isinstance(size, int) else None, _tokenizer_identity(Path(folder)))


def _tokenizer_identity(folder: Path) -> str | None:
    try:
        data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    key = {"model": data.get("model"), "added_tokens": data.get("added_tokens")}
    return hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def vocab_difference(first: tuple[str, Vocab], second: tuple[str, Vocab]) -> str | None:
    """Why models `first` and `second` (name, vocab) cannot share token ids, for a message; None if they can."""
    (a, va), (b, vb) = first, second
    where = f"'{a}' ({shown(va.folder)}) and '{b}' ({shown(vb.folder)})"
    if va.size is not None and vb.size is not None and va.size != vb.size:
        return (
            f"models {where} do not share a vocabulary: vocab_size {va.size} and {vb.size} in their "
            "config.json; a token one writes is out of range for the other"
        )
    if va.tokenizer is not None and vb.tokenizer is not None and va.tokenizer != vb.tokenizer:
        return (
            f"models {where} do not share a tokenizer: their tokenizer.json differ in vocabulary, merges or "
            "added tokens; a token id would mean another text to the other model"
        )
    return None


def vocab_problems(folders: dict[str, str]) -> list[tuple[str, str]]:
    """(model, message) for each model (name -> folder, first is the reference, e.g. the entry) whose
    vocabulary differs from the first readable one's. Folders without a config.json are left out."""
    known = [(name, v) for name, folder in folders.items() if (v := read_vocab(folder)) is not None]
    if not known:
        return []
    ref = known[0]
    return [(name, msg) for name, v in known[1:] if (msg := vocab_difference(ref, (name, v))) is not None]
