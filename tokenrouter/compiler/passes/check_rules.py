"""Rules: an unconditional rule is the last of its block, no route to the model itself, `for K` with
1 ≤ K ≤ MAX_FOR_K."""

from __future__ import annotations

from tokenrouter.compiler.program import Program
from tokenrouter.dsl.diagnostics import Diagnostic

MAX_FOR_K = 1_000_000  # tokens; longer than any model's context, and far inside the runtime's int64


def check_rules(program: Program) -> Program:
    diags: list[Diagnostic] = []
    root = program.root
    if root is None:
        return program
    for model, rules in program.routes.items():
        unconditional = None
        for r in rules:
            if unconditional is not None:
                line = unconditional.rule.span.line
                diags.append(
                    root.src.error(
                        r.rule.span,
                        f"this rule is never tried: the unconditional rule on line {line} always fires first",
                    )
                )
            elif r.cond is None:
                unconditional = r
            _check_rule(root, model, r, diags)
    return program.with_(diags)


def _check_rule(root, model: str, r, diags: list[Diagnostic]) -> None:
    """A rule of `model`'s route: its target another model, its `for K` within [1, MAX_FOR_K]."""
    if r.target == model:
        diags.append(
            root.src.error(
                r.rule.target.span,
                f"route to the model itself ('{model}'); a request that stays needs no rule",
            )
        )
    if r.for_k is not None and r.for_k < 1:
        assert r.rule.for_k is not None
        diags.append(root.src.error(r.rule.for_k.span, f"`for K` needs K ≥ 1, got {r.for_k}"))
    elif r.for_k is not None and r.for_k > MAX_FOR_K:
        assert r.rule.for_k is not None
        diags.append(
            root.src.error(
                r.rule.for_k.span,
                f"`for K` needs K ≤ {MAX_FOR_K} (longer than any context), got {r.for_k}",
            )
        )
