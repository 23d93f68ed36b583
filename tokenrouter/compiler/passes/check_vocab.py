"""The models of a policy share one tokenizer (`compiler.vocab`), checked where their folders are at hand;
each model that differs from the entry gets an error at its path."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.compiler.program import Program
from tokenrouter.compiler.vocab import vocab_problems


def check_vocab(program: Program) -> Program:
    root = program.root
    if root is None or not program.models:
        return program
    names = sorted(program.models, key=lambda name: name != program.entry)  # the entry is the reference
    folders = {
        name: path for name in names if (path := program.models[name].get("path")) and Path(path).is_dir()
    }
    diags = [
        root.src.error(program.model_decls[name].path.span, message)
        for name, message in vocab_problems(folders)
        if name in program.model_decls
    ]
    return program.with_(diags)
