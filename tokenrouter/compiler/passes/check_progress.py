"""No progress: models whose every step drops its token and hands off (all rules `drop` without `for`, the
last one unconditional) can pass a request among themselves forever without committing a token."""

from __future__ import annotations

from tokenrouter.compiler.program import Program
from tokenrouter.dsl.diagnostics import Diagnostic


def never_committing(routes: dict[str, tuple]) -> set[str]:
    """The largest set S of models that never commit a token and only hand off within S."""
    s = {
        m
        for m, rules in routes.items()
        if rules and rules[-1].cond is None and all(r.drop and r.for_k is None for r in rules)
    }
    changed = True
    while changed:
        changed = False
        for m in sorted(s):
            if any(r.target not in s for r in routes[m]):
                s.discard(m)
                changed = True
    return s


def check_progress(program: Program) -> Program:
    root = program.root
    if root is None:
        return program
    stuck = never_committing(program.routes)
    if not stuck:
        return program.with_(checks={**program.checks, "progress": {"ok": True}})
    cycle = " → ".join(sorted(stuck))
    diags: list[Diagnostic] = []
    for m in sorted(stuck):
        rule = program.routes[m][-1].rule
        diags.append(
            root.src.error(
                rule.span,
                f"no progress: {cycle} hand a request to each other with `drop` on every step, so no token is ever committed",
            )
        )
    return program.with_(diags, checks={**program.checks, "progress": {"ok": False, "models": sorted(stuck)}})
