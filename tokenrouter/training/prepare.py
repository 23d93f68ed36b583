"""Prepare the demo corpus: split the stdlib, train the tokenizer, write token arrays and text folders.

    python -m tokenrouter.training.prepare --out .data/corpus

writes ``OUT/tokenizer/`` (tokenizer.json, tokenizer_config.json), ``OUT/train.npy`` and ``OUT/val.npy``
(uint16 token ids of the LM-train part and of the router part, documents joined by EOS: what the training
script reads), ``OUT/router/`` and ``OUT/eval/`` (one text file per module: the ``--data`` folders of
``tokenrouter train-router`` and ``tokenrouter eval``) and ``OUT/manifest.json`` (module -> part).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .corpus import SplitConfig, export_texts, find_sources, read_text, split_sources
from .tokenizer import TokenizerConfig, encode_document, save_tokenizer, train_tokenizer


def tokenize_files(tok, files) -> np.ndarray:
    ids: list[int] = []
    for s in files:
        text = read_text(s.path)
        if text and text.strip():
            ids.extend(encode_document(tok, text)[:-1])  # the next document's leading EOS ends this one
    ids.append(tok.token_to_id("<|endoftext|>"))
    return np.asarray(ids, dtype=np.uint16)


def prepare(
    out: Path, root: Path | None = None, vocab_size: int = 4096, split: SplitConfig | None = None
) -> dict:
    sources = find_sources(root)
    parts = split_sources(sources, split)
    if not parts["train"]:
        raise ValueError("the split left no files for training")
    train_texts = [t for s in parts["train"] if (t := read_text(s.path))]
    tok = train_tokenizer(train_texts, TokenizerConfig(vocab_size=vocab_size))
    out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, out / "tokenizer")
    train_ids = tokenize_files(tok, parts["train"])
    val_ids = tokenize_files(tok, parts["router"])
    np.save(out / "train.npy", train_ids)
    np.save(out / "val.npy", val_ids)
    counts = {p: export_texts(parts[p], out / p) for p in ("router", "eval")}
    _write_manifest(out, parts, tok.get_vocab_size())
    return {
        "files": {p: len(fs) for p, fs in parts.items()},
        "exported": counts,
        "train_tokens": int(train_ids.size),
        "val_tokens": int(val_ids.size),
        "vocab_size": tok.get_vocab_size(),
    }


def _write_manifest(out: Path, parts: dict, vocab_size: int) -> None:
    """manifest.json: which part each source module went to, and the tokenizer's vocabulary size."""
    manifest = {"parts": {s.module: p for p, fs in parts.items() for s in fs}, "vocab_size": vocab_size}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--root", type=Path, default=None, help="source folder (default: this Python's stdlib)")
    ap.add_argument("--vocab-size", type=int, default=4096)
    args = ap.parse_args(argv)
    try:
        summary = prepare(args.out, args.root, args.vocab_size)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
