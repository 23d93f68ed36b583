"""The playground page (`GET /`) and the JSON stats it charts (`GET /v1/stats`); docs/serving.md, "Playground".

The page is one static HTML file shipped in the package (plain JS, inline SVG: no CDN, no build step). It loads
without the API key; every call it makes sends the key the user typed in.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

from tokenrouter.runtime.frontend.config import FrontendArgs
from tokenrouter.runtime.frontend.metrics import Metrics
from tokenrouter.runtime.messages import SubserverStats

PAGE_PATH = "/"  # open without the key (the page asks for it)

# per subserver, what the page charts: counters (it charts their rates) and gauges
_SUBSERVER_FIELDS: dict[str, Callable[[SubserverStats], float]] = {
    "steps": lambda s: s.step.count,
    "rows_total": lambda s: s.step.rows,
    "new_tokens_total": lambda s: s.step.new_tokens,
    "busy_ms": lambda s: s.step.busy_ms,
    "uptime_ms": lambda s: s.step.uptime_ms,
    "waiting": lambda s: s.queue.waiting,
    "running": lambda s: s.queue.running,
    "pending": lambda s: s.queue.pending,
    "last_batch_size": lambda s: s.step.last_batch_size,
    "batch_threshold": lambda s: s.step.batch_threshold,
    "kv_pages_total": lambda s: s.kv.pages_total,
    "kv_pages_free": lambda s: s.kv.pages_free,
}


def page_html() -> str:
    return resources.files(__package__).joinpath("static/playground.html").read_text(encoding="utf-8")


def stats(metrics: Metrics, active: int, args: FrontendArgs) -> dict:
    """The stats document (`Metrics.stats_document`) with the served plan's names, and per subserver the
    figures the page charts (`subservers`)."""
    return {
        **metrics.stats_document(active),
        "policy": args.policy,
        "entry": args.entry,
        "models": list(args.models),
        "subservers": {
            x: {f: get(s) for f, get in _SUBSERVER_FIELDS.items()} for x, s in sorted(metrics.stats.items())
        },
    }


def add_playground(app: FastAPI, args: FrontendArgs) -> None:
    # the page knows whether to ask for the key before its first call (no refused call on a plain load)
    html = page_html().replace("__AUTH__", "key" if args.api_key else "none")

    @app.get(PAGE_PATH, include_in_schema=False)
    async def playground() -> HTMLResponse:
        return HTMLResponse(html, headers={"Cache-Control": "no-cache"})

    @app.get("/v1/stats")
    async def stats_json(request: Request) -> dict:
        mgr = request.app.state.manager
        return stats(mgr.metrics, mgr.n_active, args)
