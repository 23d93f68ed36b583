"""Router weights: when the safetensors file and the models' config.json are at hand, the tensors must
fit the inputs (layout in docs/ir.md: D = Σ input widths). A router file that is not there is an error (a
warning when compiling without the weights check); a config.json that is not there: a warning.
Fills `sha256` of every router file present."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tokenrouter import hub
from tokenrouter.compiler.paths import near_miss, shown
from tokenrouter.compiler.program import Program
from tokenrouter.compiler.safetensors_header import HeaderError, read_header
from tokenrouter.dsl.diagnostics import Diagnostic

FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
WEIGHTS_HINT = "train it with `tokenrouter train-router`, or compile with --no-weights-check on a machine without the weights"


def hidden_size(model_path: str | None) -> int | None:
    if not model_path:
        return None
    folder = hub.cached(model_path) if hub.is_hub_id(model_path) and not Path(model_path).exists() else None
    cfg = Path(folder or model_path) / "config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    text_config = data.get("text_config")
    value = data.get("hidden_size", text_config.get("hidden_size") if isinstance(text_config, dict) else None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def input_width(inp: dict[str, Any], models: dict[str, dict[str, Any]]) -> int | None:
    if inp["kind"] in ("topk_logits", "topk_logprobs"):
        return inp["k"]
    return hidden_size(models.get(inp["model"], {}).get("path"))


def _layer_names(kind: str, shapes: dict[str, list[int]]) -> list[tuple[str, str]]:
    """The (weight, bias) tensor names of each layer, in order (none for an mlp without layers.0)."""
    if kind == "linear":
        return [("weight", "bias")]
    n = 0
    while f"layers.{n}.weight" in shapes:
        n += 1
    return [(f"layers.{i}.weight", f"layers.{i}.bias") for i in range(n)]


def _layers_problem(names: list[tuple[str, str]], shapes: dict[str, list[int]], d: int | None) -> str | None:
    """What is wrong with the layers' shapes: each takes the previous one's outputs, the last outputs 1."""
    width = d
    for w, b in names:
        if w not in shapes or b not in shapes:
            return f"missing tensor '{w if w not in shapes else b}'"
        ws, bs = shapes[w], shapes[b]
        if len(ws) != 2 or bs != [ws[0]]:
            return f"'{w}' is {ws} and '{b}' is {bs}; expected [H, D] and [H]"
        if width is not None and ws[1] != width:
            return f"'{w}' is {ws}: it takes {ws[1]} inputs, but the router's inputs are {width} wide"
        width = ws[0]
    if width != 1:
        return f"the last layer has {width} outputs; a router outputs 1"
    return None


def layout_problem(kind: str, tensors: dict[str, dict[str, Any]], d: int | None) -> str | None:
    """What is wrong with the tensors for a router of `kind` with input width `d` (None: width unknown)."""
    shapes = {k: v["shape"] for k, v in tensors.items()}
    for name, info in tensors.items():
        if info["dtype"] not in FLOAT_DTYPES:
            return f"tensor '{name}' has dtype {info['dtype']}, expected a float dtype"
    names = _layer_names(kind, shapes)
    if not names:
        return "an mlp router needs tensors layers.0.weight, layers.0.bias, …"
    if problem := _layers_problem(names, shapes, d):
        return problem
    for extra in ("input_mean", "input_std"):
        if extra in shapes and d is not None and shapes[extra] != [d]:
            return f"'{extra}' is {shapes[extra]}, expected [{d}]"
    known = {x for pair in names for x in pair} | {"input_mean", "input_std"}
    unknown = sorted(set(shapes) - known)
    if unknown:
        return f"unexpected tensor '{unknown[0]}'"
    return None


def check_routers(program: Program) -> Program:
    diags: list[Diagnostic] = []
    routers: dict[str, dict[str, Any]] = {}
    for name, r in program.routers.items():
        r = dict(r)
        _check_router(program, r, diags)
        routers[name] = r
    return program.with_(diags, routers=routers)


def _missing_weights(program: Program, unit, decl, span, path: Path) -> Diagnostic:
    """A router's weights file is not there: an error, or a warning where weights are not checked."""
    what = (
        f"{shown(path)} is a directory, not a weights file"
        if path.is_dir()
        else f"weights not found at {shown(path)}{near_miss(path)}"
    )
    if program.weights_check:
        return unit.src.error(span, f"router '{decl.name.name}': {what}; {WEIGHTS_HINT}")
    return unit.src.warning(span, f"router '{decl.name.name}': {what}; shapes not checked")


def _check_router(program: Program, r: dict[str, Any], diags: list[Diagnostic]) -> None:
    """One router: its weights file is there (its digest recorded in `r`), of the declared kind, and its
    layers fit the declared inputs."""
    unit, decl = r["_decl"]
    span = decl.call.args[0].span if decl.call.args else decl.span
    path = Path(r["path"])
    if not path.is_file():
        diags.append(_missing_weights(program, unit, decl, span, path))
        return
    try:
        tensors, metadata = read_header(shown(path))
        r["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    except (OSError, HeaderError) as e:
        diags.append(unit.src.error(span, f"router '{decl.name.name}': {e}"))
        return
    d = _input_width(program, r, unit, decl, span, diags)
    file_kind = metadata.get("kind")
    if file_kind is not None and file_kind != r["kind"]:
        diags.append(_kind_mismatch(unit, decl, r["kind"], path, file_kind))
    elif problem := layout_problem(r["kind"], tensors, d):
        what = f"router '{decl.name.name}': weights do not fit its inputs: {problem} ({shown(path)})"
        diags.append(unit.src.error(span, what))


def _kind_mismatch(unit, decl, kind: str, path: Path, file_kind: str) -> Diagnostic:
    return unit.src.error(
        decl.call.func.span,
        f"router '{decl.name.name}' is declared {kind}(...) but {path.name} holds {'an' if file_kind == 'mlp' else 'a'} {file_kind} router",
    )


def _input_width(
    program: Program, r: dict[str, Any], unit, decl, span, diags: list[Diagnostic]
) -> int | None:
    """The width of the router's inputs (None, with a warning, where a model's config.json is not at hand)."""
    widths = [input_width(i, program.models) for i in r["inputs"]]
    if all(w is not None for w in widths):
        return sum(widths)
    missing = sorted({i["model"] for i, w in zip(r["inputs"], widths, strict=False) if w is None})
    diags.append(
        unit.src.warning(
            span,
            f"router '{decl.name.name}': config.json of {', '.join(missing)} not at hand; input width not checked",
        )
    )
    return None
