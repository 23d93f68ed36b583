"""Where the models run (`gpu` / `gpus`, `mem`). A model on several GPUs runs tensor-parallel over them and holds
its share of the weights and the KV on each. A GPU that several models are on is shared: the `mem` fractions given
for them must sum to at most 1 there (a model without `mem` takes what is free when it loads). A tensor-parallel
model splits its attention heads, KV heads and MLP evenly over its GPUs: where its folder's config.json is at hand,
their number must divide each (the subserver refuses it at start otherwise)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenrouter.compiler.program import Program
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic

SPLIT = ("num_attention_heads", "num_key_value_heads", "intermediate_size")


def _option_span(decl: ast.ModelDecl, keys: tuple[str, ...]) -> ast.Span:
    for opt in decl.options or ():
        if opt.key.name in keys:
            return opt.span
    return decl.span


def _split_problem(folder: str, gpus: int) -> str | None:
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a folder that is not there is reported by check_options
    if not isinstance(config, dict):
        return None
    if "num_key_value_heads" not in config:  # HF's default: as many KV heads as attention heads
        config = {**config, "num_key_value_heads": config.get("num_attention_heads")}
    for name in SPLIT:
        value = config.get(name)
        if isinstance(value, int) and value > 0 and value % gpus:
            return (
                f"{gpus} GPUs do not divide the model's {name} ({value}): tensor parallelism splits it evenly "
                "over the GPUs of `gpus`"
            )
    return None


def check_placement(program: Program) -> Program:
    root = program.root
    if root is None or not program.models:
        return program
    diags = []
    shares: dict[int, list[tuple[str, float]]] = {}
    for name, spec in program.models.items():
        decl = program.model_decls.get(name)
        gpus = spec.get("gpus") or [0]
        if decl is None:
            continue
        if spec.get("mem") is not None:
            for gpu in gpus:
                shares.setdefault(gpu, []).append((name, spec["mem"]))
        if len(gpus) > 1 and spec.get("path") and (problem := _split_problem(spec["path"], len(gpus))):
            diags.append(root.src.error(_option_span(decl, ("gpus",)), problem))
    for gpu, given in sorted(shares.items()):
        total = sum(share for _, share in given)
        if len(given) > 1 and total > 1 + 1e-9:
            diags.append(_overcommitted(program, root, gpu, given, total))
    return program.with_(diags)


def _overcommitted(
    program: Program, root, gpu: int, given: list[tuple[str, float]], total: float
) -> Diagnostic:
    """The error of a GPU whose models' `mem` shares sum to more than 1 (at the last one's `mem`)."""
    parts = " + ".join(f"{share:g} ({name})" for name, share in given)
    last = program.model_decls[given[-1][0]]
    return root.src.error(
        _option_span(last, ("mem",)),
        f"GPU {gpu} is given {parts} = {total:g} of its memory: the models on one GPU share it, "
        "so their `mem` must sum to at most 1",
    )
