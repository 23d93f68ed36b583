"""Model options, `serve` and `entry`: each option known and of its type (LANGUAGE.md), model paths
resolved. Result: `program.models`, `program.serve`, `program.entry` shaped as in docs/ir.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenrouter import hub
from tokenrouter.compiler.consteval import ConstError, evaluate, type_of
from tokenrouter.compiler.paths import looks_like_hub_id, near_miss, resolve_source_path, shown
from tokenrouter.compiler.program import Program, Unit
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, did_you_mean

MODEL_OPTIONS = ("gpu", "gpus", "batch", "mem", "dtype", "max_len", "engine", "load")
SERVE_OPTIONS = ("concurrency", "max_delay_ms")
DTYPES = ("bfloat16", "float16", "float32")
ENGINES = ("embedded", "sglang")
LOADS = ("auto", "dummy")
MODEL_DEFAULTS: dict[str, Any] = {
    "gpus": [0], "batch": "auto", "mem": None, "dtype": "bfloat16", "max_len": None,
    "engine": "embedded", "load": "auto",
}  # fmt: skip
SERVE_DEFAULTS: dict[str, Any] = {"concurrency": 8, "max_delay_ms": 5.0}
MAX_CONCURRENCY = 65536  # requests in flight on one server: beyond any deployment, and `tune` stays fast


def param_getter(program: Program):
    def get(unit: Unit, decl: ast.ParamDecl, span: ast.Span) -> Any:
        entry = program.params.get(unit.prefix + decl.name.name)
        if entry is None:
            raise ConstError(span, "")  # the param's own error is reported by bind_params
        return entry["value"]

    return get


def check_options(program: Program) -> Program:
    root = program.root
    if root is None:
        return program
    diags: list[Diagnostic] = []
    get = param_getter(program)
    models: dict[str, dict[str, Any]] = {}
    for name, decl in root.table(ast.ModelDecl).items():
        models[name] = _model(root, decl, get, diags, program.weights_check)
    serve = dict(SERVE_DEFAULTS)
    serves = root.decls(ast.ServeDecl)
    for extra in serves[1:]:
        diags.append(root.src.error(extra.span, "a policy has at most one `serve` block"))
    if serves:
        serve.update(_serve(root, serves[0], get, diags))
    entries = root.decls(ast.EntryDecl)
    entry = entries[0].model.name if entries and entries[0].model.name in models else None
    decls = root.table(ast.ModelDecl)
    return program.with_(diags, models=models, model_decls=decls, serve=serve, entry=entry)


def _const(unit: Unit, expr: ast.Expr, get, diags: list[Diagnostic]) -> Any:
    try:
        return evaluate(expr, unit, get)
    except ConstError as e:
        if e.message:
            diags.append(unit.src.error(e.span, e.message))
        return None


def _model(
    root: Unit, decl: ast.ModelDecl, get, diags: list[Diagnostic], weights_check: bool
) -> dict[str, Any]:
    spec: dict[str, Any] = {"path": None, **MODEL_DEFAULTS}
    if _model_path(root, decl, get, diags, weights_check, spec):
        _model_options(root, decl, get, diags, spec)
    return spec


def _model_path(
    root: Unit, decl: ast.ModelDecl, get, diags: list[Diagnostic], weights_check: bool, spec: dict[str, Any]
) -> bool:
    """The model's folder, resolved into `spec["path"]`; False where the path is one no folder can have."""
    path = _const(root, decl.path, get, diags)
    if path is not None:
        if isinstance(path, str) and path.strip():
            try:
                resolved, exists = resolve_source_path(path, root.dir)
            except ValueError as e:
                diags.append(root.src.error(decl.path.span, f"model '{decl.name.name}': {e}"))
                return False
            spec["path"] = resolved
            what = _model_folder_problem(
                path, resolved, exists, root.file if root.file.endswith(".tr") else None
            )
            if what:
                # a hub id is fetched where it is served; a local folder must be here unless asked otherwise
                is_hub = not exists and resolved == path and looks_like_hub_id(path)
                report = root.src.error if weights_check and not is_hub else root.src.warning
                diags.append(report(decl.path.span, f"model '{decl.name.name}': path {what}"))
        else:
            got = "an empty str" if isinstance(path, str) else type_of(path)
            diags.append(root.src.error(decl.path.span, f"a model path is a non-empty str, got {got}"))
    return True


def _model_options(
    root: Unit, decl: ast.ModelDecl, get, diags: list[Diagnostic], spec: dict[str, Any]
) -> None:
    """The model's options into `spec`: each known, given once, of a value it takes."""
    seen: dict[str, ast.Option] = {}
    for opt in decl.options or ():
        key = opt.key.name
        if problem := _option_key_problem(key, seen):
            diags.append(root.src.error(opt.key.span, problem))
            continue
        seen[key] = opt
        value = _const(root, opt.value, get, diags)
        if value is None:
            continue
        problem = _set_model_option(spec, key, value)
        if problem:
            diags.append(root.src.error(opt.value.span, f"option '{key}': {problem}"))


def _option_key_problem(key: str, seen: dict[str, ast.Option]) -> str | None:
    """What is wrong with a model option's name: unknown, or given before (`seen`)."""
    if key not in MODEL_OPTIONS:
        return f"unknown model option '{key}'{did_you_mean(key, MODEL_OPTIONS)}; options are {', '.join(MODEL_OPTIONS)}"
    if key in seen or (key in ("gpu", "gpus") and ({"gpu", "gpus"} & set(seen))):
        return f"option '{key}' given twice (gpu and gpus are one option)"
    return None


def _model_folder_problem(written: str, resolved: str, exists: bool, source: str | None) -> str | None:
    """What is wrong with a model path as seen on this machine (an error, or a warning when compiling without
    the weights check: a plan may be compiled on one machine and served on another); None for a folder with a
    config.json. A hub id (kept as written in the plan) is looked up in the local hub cache."""
    if not exists and not (resolved == written and looks_like_hub_id(written)):
        return f"not found: {shown(resolved)}{near_miss(resolved)}"
    folder = Path(resolved)
    if not exists:
        cached = hub.cached(written)
        if cached is None:
            return hub.missing_message(written, source)
        folder = cached
    if not folder.is_dir():
        return f"{shown(folder)} is a file; a model is a folder in Hugging Face format (config.json, weights)"
    if not (folder / "config.json").is_file():
        return f"{shown(folder)} has no config.json; a model is a folder in Hugging Face format"
    return None


def _is_int(v: Any) -> bool:
    return type_of(v) == "int"


def _set_gpus(spec: dict[str, Any], key: str, v: Any) -> str | None:
    """`gpu: N` or `gpus: [N, …]` into spec["gpus"]; what is wrong with the value, or None."""
    if key == "gpu":
        if not _is_int(v) or v < 0:
            return f"expected a GPU index (int ≥ 0), got {v!r}"
        spec["gpus"] = [v]
        return None
    if not isinstance(v, list) or not v or not all(_is_int(g) and g >= 0 for g in v):
        return f"expected a non-empty list of GPU indices, got {v!r}"
    if len(set(v)) != len(v):
        return "a GPU is listed twice"
    spec["gpus"] = list(v)
    return None


def _set_model_option(spec: dict[str, Any], key: str, v: Any) -> str | None:
    if key in ("gpu", "gpus"):
        return _set_gpus(spec, key, v)
    if key == "batch":
        if v == "auto":
            spec["batch"] = "auto"
        elif not _is_int(v) or v < 1:
            return f"expected an int ≥ 1 or auto, got {v!r}"
        else:
            spec["batch"] = v
    elif key == "mem":
        if type_of(v) not in ("int", "float") or not (0 < v <= 1):
            return f"expected a fraction in (0, 1], got {v!r}"
        spec["mem"] = float(v)
    elif key == "max_len":
        if not _is_int(v) or v < 1:
            return f"expected an int ≥ 1, got {v!r}"
        spec["max_len"] = v
    else:
        choices = {"dtype": DTYPES, "engine": ENGINES, "load": LOADS}[key]
        if v not in choices or not isinstance(v, str):
            listed = ", ".join(repr(c).replace(chr(39), chr(34)) for c in choices)
            return f"expected one of {listed}, got {v!r}"
        spec[key] = v
    return None


def _serve(root: Unit, decl: ast.ServeDecl, get, diags: list[Diagnostic]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for opt in decl.options:
        key = opt.key.name
        if key not in SERVE_OPTIONS:
            diags.append(
                root.src.error(
                    opt.key.span,
                    f"unknown serve option '{key}'{did_you_mean(key, SERVE_OPTIONS)}; options are {', '.join(SERVE_OPTIONS)}",
                )
            )
            continue
        if key in out:
            diags.append(root.src.error(opt.key.span, f"option '{key}' given twice"))
            continue
        v = _const(root, opt.value, get, diags)
        if v is None:
            continue
        problem = _serve_problem(key, v)
        if problem:
            diags.append(root.src.error(opt.value.span, problem))
            continue
        out[key] = v if key == "concurrency" else float(v)
    return out


def _serve_problem(key: str, v: Any) -> str | None:
    """What is wrong with a serve option's value (None: nothing)."""
    if key == "concurrency":
        if not _is_int(v) or v < 1:
            return f"concurrency is an int ≥ 1, got {v!r}"
        if v > MAX_CONCURRENCY:
            return f"concurrency is at most {MAX_CONCURRENCY} requests in flight, got {v}"
        return None
    if type_of(v) not in ("int", "float") or v < 0:
        return f"max_delay_ms is a number ≥ 0, got {v!r}"
    return None
