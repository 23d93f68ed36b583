"""`tokenrouter inspect PLAN`: a plan as readable text.

`sections(plan)` returns (title, lines) pairs; `render(plan)` joins them. To show more (e.g. the rendered
route kernels), add a function that returns another section and append it in the command.
"""

from __future__ import annotations

from typing import Any


def _model_line(name: str, m: dict[str, Any], entry: str) -> str:
    opts = [f"gpus {m['gpus']}", f"batch {m['batch']}", m["dtype"], f"engine {m['engine']}"]
    if m["mem"] is not None:
        opts.append(f"mem {m['mem']}")
    if m["max_len"] is not None:
        opts.append(f"max_len {m['max_len']}")
    if m["load"] != "auto":
        opts.append(f"load {m['load']}")
    mark = "  (entry)" if name == entry else ""
    return f"{name}: {m['path']}  [{', '.join(opts)}]{mark}"


def sections(plan: dict[str, Any]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    pol = plan["policy"]
    head = [f"{pol['name']}" + (f" — {pol['description']}" if pol["description"] else "")]
    head.append(f"source: {plan['source']['path']} (sha256 {plan['source']['sha256'][:12]}…)")
    out.append(("policy", head))
    if plan["params"]:
        out.append(("params", [f"{k}: {v['type']} = {v['value']!r}" for k, v in plan["params"].items()]))
    out.append(("models", [_model_line(n, m, plan["entry"]) for n, m in plan["models"].items()]))
    out.append(("entry", [plan["entry"]]))
    s = plan["serve"]
    out.append(("serve", [f"concurrency {s['concurrency']}, max_delay_ms {s['max_delay_ms']}"]))
    if plan["routers"]:
        lines = []
        for n, r in plan["routers"].items():
            ins = ", ".join(
                f"{i['kind']}({i['model']}" + (f", {i['k']})" if "k" in i else ")") for i in r["inputs"]
            )
            sha = f"sha256 {r['sha256'][:12]}…" if r["sha256"] else "file not at hand when compiled"
            lines.append(f"{n}: {r['kind']}({ins}) reads {r['model']}; {r['path']} ({sha})")
        out.append(("routers", lines))
    route_lines: list[str] = []
    for name, route in plan["routes"].items():
        feats = ", ".join(route["features"]) or "none"
        extra = []
        if route["routers"]:
            extra.append("routers " + ", ".join(route["routers"]))
        if route["uses_uniform"]:
            extra.append("uniform()")
        reads = f"features: {feats}" + ("; " + "; ".join(extra) if extra else "")
        route_lines.append(f"{name}  ({reads}; {len(route['nodes'])} IR nodes)")
        if not route["rules"]:
            route_lines.append("  (no rules: always stays)")
        for i, r in enumerate(route["rules"]):
            route_lines.append(f"  [{i}] line {r['line']}: {r['source']}")
    out.append(("routes", route_lines))
    feas = plan["checks"]["feasibility"]
    status = "ok" if feas["ok"] else "INFEASIBLE"
    fixed = ", ".join(f"{m}={b}" for m, b in feas["fixed"].items()) or "none"
    auto = ", ".join(feas["auto"]) or "none"
    out.append(
        (
            "thresholds",
            [f"fixed: {fixed}", f"auto (resolved by tune; at least 1): {auto}"],
        )
    )
    out.append(
        (
            "checks",
            [
                f"feasibility: {status} — {feas['message']} (slack {feas['slack']})",
                f"progress: {'ok' if plan['checks']['progress']['ok'] else 'NO PROGRESS'}",
            ],
        )
    )
    return out


def render(plan: dict[str, Any], extra: list[tuple[str, list[str]]] | None = None) -> str:
    parts = []
    for title, lines in sections(plan) + list(extra or []):
        parts.append(f"{title}:")
        parts.extend(f"  {line}" for line in lines)
    return "\n".join(parts)
