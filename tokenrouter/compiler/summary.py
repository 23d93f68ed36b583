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
        out.append(("routers", [_router_line(n, r) for n, r in plan["routers"].items()]))
    out.append(
        ("routes", [line for name, route in plan["routes"].items() for line in _route_lines(name, route)])
    )
    feas = plan["checks"]["feasibility"]
    fixed = ", ".join(f"{m}={b}" for m, b in feas["fixed"].items()) or "none"
    auto = ", ".join(feas["auto"]) or "none"
    out.append(("thresholds", [f"fixed: {fixed}", f"auto (resolved by tune; at least 1): {auto}"]))
    if isinstance(plan.get("tuning"), dict):
        out.append(("tuning", _tuning_lines(plan["tuning"])))
    out.append(("checks", _check_lines(plan["checks"])))
    return out


def _router_line(name: str, r: dict) -> str:
    ins = ", ".join(f"{i['kind']}({i['model']}" + (f", {i['k']})" if "k" in i else ")") for i in r["inputs"])
    sha = f"sha256 {r['sha256'][:12]}…" if r["sha256"] else "file not at hand when compiled"
    return f"{name}: {r['kind']}({ins}) reads {r['model']}; {r['path']} ({sha})"


def _route_lines(name: str, route: dict) -> list[str]:
    """A model's route: what it reads, then its rules."""
    feats = ", ".join(route["features"]) or "none"
    extra = []
    if route["routers"]:
        extra.append("routers " + ", ".join(route["routers"]))
    if route["uses_uniform"]:
        extra.append("uniform()")
    reads = f"features: {feats}" + ("; " + "; ".join(extra) if extra else "")
    lines = [f"{name}  ({reads}; {len(route['nodes'])} IR nodes)"]
    if not route["rules"]:
        lines.append("  (no rules: always stays)")
    for i, r in enumerate(route["rules"]):
        lines.append(f"  [{i}] line {r['line']}: {r['source']}")
    return lines


def _check_lines(checks: dict) -> list[str]:
    feas = checks["feasibility"]
    status = "ok" if feas["ok"] else "INFEASIBLE"
    return [
        f"feasibility: {status} — {feas['message']} (slack {feas['slack']})",
        f"progress: {'ok' if checks['progress']['ok'] else 'NO PROGRESS'}",
    ]


def _num(x: Any, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else "?"


def _per_model(d: Any, unit: str = "") -> str:
    return ", ".join(f"{m} {_num(v, 'g')}{unit}" for m, v in d.items()) if isinstance(d, dict) else "?"


def _tuning_lines(t: dict[str, Any]) -> list[str]:
    """What `tokenrouter tune` chose and how (the plan's `tuning` record, docs/ir.md)."""
    r = t.get("result") if isinstance(t.get("result"), dict) else {}
    best, n = _per_model(r.get("best")), t.get("concurrency", "?")
    if r.get("method") == "open-loop simulation":
        lines = _open_loop_lines(r, best, n)
    else:
        lines = [
            f"N = {n}, by the chain ({r.get('method', '?')} search, δ {_num(t.get('delta_ms'), 'g')} ms): B* {best}, "
            f"T {_num(r.get('throughput_tok_s'), '.1f')} tok/s predicted"
        ]
        if t.get("gap_ms"):
            lines.append(f"host time per step, added in the chain: {_per_model(t['gap_ms'], ' ms')}")
    sources = t.get("sources") if isinstance(t.get("sources"), dict) else {}
    steps = sources.get("step_ms") if isinstance(sources.get("step_ms"), dict) else {}
    if steps:
        lines.append("step latencies from: " + ", ".join(f"{m} {src}" for m, src in steps.items()))
    lines += [f"warning: {w}" for w in t.get("warnings") or [] if isinstance(w, str)]
    return lines


def _open_loop_lines(r: dict, best: str, n: Any) -> list[str]:
    """`tune --request-rate`'s choice: the load, the objective and the delays it added."""
    lines = [
        f"N = {n}, for latency at {_num(r.get('request_rate_per_s'), 'g')} requests/s of "
        f"{r.get('request_tokens', '?')} tokens (open-loop simulation): B* {best}, {r.get('objective', '?')} "
        f"{_num(r.get('score_ms'), '.1f')} ms, {_num(r.get('throughput_tok_s'), '.1f')} tok/s simulated"
    ]
    for key, what in (("hop_ms", "hop delay into each model"), ("gap_ms", "host time per step")):
        if r.get(key):
            lines.append(f"{what}: {_per_model(r[key], ' ms')}")
    return lines


def render(plan: dict[str, Any], extra: list[tuple[str, list[str]]] | None = None) -> str:
    parts = []
    for title, lines in sections(plan) + list(extra or []):
        parts.append(f"{title}:")
        parts.extend(f"  {line}" for line in lines)
    return "\n".join(parts)
