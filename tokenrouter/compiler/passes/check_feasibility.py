"""Deadlock feasibility of delayed batching: with concurrency N and fixed thresholds B_i, batches can
stall unless Σ(B_i − 1) < N. `batch: auto` counts as at least 1 (it is resolved later by `tune`)."""

from __future__ import annotations

from typing import Any

from tokenrouter.compiler.program import Program
from tokenrouter.dsl import ast


def feasibility_error(thresholds: dict[str, int], concurrency: int) -> str | None:
    """The message for infeasible fixed thresholds, or None when Σ(B_i − 1) < N."""
    total = sum(b - 1 for b in thresholds.values())
    if total < concurrency:
        return None
    terms = ", ".join(f"{m} batch {b}" for m, b in sorted(thresholds.items()))
    return (
        f"delayed batching can deadlock: the fixed thresholds ({terms}) give Σ(B_i − 1) = {total}, "
        f"which must be < concurrency N = {concurrency}; lower a threshold, use `batch: auto`, "
        f"or raise `serve {{ concurrency }}`"
    )


def feasibility(models: dict[str, dict[str, Any]], concurrency: int) -> dict[str, Any]:
    """The plan's `checks.feasibility` entry."""
    fixed = {m: s["batch"] for m, s in models.items() if s.get("batch") != "auto"}
    auto = sorted(m for m, s in models.items() if s.get("batch") == "auto")
    total = sum(b - 1 for b in fixed.values())
    error = feasibility_error(fixed, concurrency)
    message = error or f"Σ(B_i − 1) = {total} < N = {concurrency}" + (
        f" (auto thresholds {', '.join(auto)} counted as 1)" if auto else ""
    )
    return {
        "ok": error is None,
        "concurrency": concurrency,
        "fixed": dict(sorted(fixed.items())),
        "auto": auto,
        "slack": concurrency - 1 - total,
        "message": message,
    }


def check_feasibility(program: Program) -> Program:
    root = program.root
    if root is None or "concurrency" not in program.serve:
        return program
    models = {
        m: s for m, s in program.models.items() if isinstance(s.get("batch"), int) or s.get("batch") == "auto"
    }
    result = feasibility(models, program.serve["concurrency"])
    diags = []
    if not result["ok"]:
        serves = root.decls(ast.ServeDecl)
        span = serves[0].span if serves else None
        if span is None:  # no serve block (N = 8 by default): point at the largest fixed threshold
            largest = max(result["fixed"], key=lambda m: result["fixed"][m])
            options = program.model_decls[largest].options or ()
            span = next((o.span for o in options if o.key.name == "batch"), program.model_decls[largest].span)
        diags.append(root.src.error(span, result["message"]))
    return program.with_(diags, checks={**program.checks, "feasibility": result})
