"""Reachability: every model can be reached from `entry` by rule hops. A `for K` hop visits its target
but returns to the source without consulting the target's rules, so it does not follow them."""

from __future__ import annotations

from tokenrouter.compiler.program import Program
from tokenrouter.dsl.diagnostics import Diagnostic


def reachable(routes: dict[str, tuple], entry: str) -> tuple[set[str], set[str]]:
    """(models reached, models whose route block is consulted)."""
    reached, consulted = {entry}, set()
    todo = [entry]
    while todo:
        m = todo.pop()
        if m in consulted:
            continue
        consulted.add(m)
        for r in routes.get(m, ()):
            reached.add(r.target)
            if r.for_k is None and r.target not in consulted:
                todo.append(r.target)
    return reached, consulted


def check_reachability(program: Program) -> Program:
    root = program.root
    if root is None or program.entry is None:
        return program
    diags: list[Diagnostic] = []
    reached, consulted = reachable(program.routes, program.entry)
    for name, decl in program.model_decls.items():
        if name not in reached:
            diags.append(
                root.src.error(
                    decl.name.span,
                    f"model '{name}' is not reachable from entry '{program.entry}': no rule hops to it",
                )
            )
        elif name not in consulted and program.routes.get(name):
            block = next((r.rule for r in program.routes[name]), None)
            span = block.span if block else decl.name.span
            diags.append(
                root.src.warning(
                    span,
                    f"the route block of '{name}' is never consulted: '{name}' is only reached by `for K` hops, which return to their source",
                )
            )
    return program.with_(diags)
