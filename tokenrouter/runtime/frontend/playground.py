"""The playground page (`GET /`) and the JSON stats it charts (`GET /v1/stats`); docs/serving.md, "Playground".

The page is one static HTML file shipped in the package (plain JS, inline SVG: no CDN, no build step). It loads
without the API key; every call it makes sends the key the user typed in.
"""

from __future__ import annotations

import time
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

from tokenrouter.runtime.frontend.config import FrontendArgs
from tokenrouter.runtime.frontend.metrics import Metrics

PAGE_PATH = "/"  # open without the key (the page asks for it)

# per subserver, the SubserverStats fields the stats carry: counters (the page charts their rates) and gauges
_SUBSERVER_FIELDS = (
    "steps",
    "rows_total",
    "new_tokens_total",
    "busy_ms",
    "uptime_ms",
    "waiting",
    "running",
    "pending",
    "last_batch_size",
    "batch_threshold",
    "kv_pages_total",
    "kv_pages_free",
)


def page_html() -> str:
    return resources.files(__package__).joinpath("static/playground.html").read_text(encoding="utf-8")


def stats(metrics: Metrics, active: int, args: FrontendArgs) -> dict:
    """A snapshot of the server's counters and gauges: what /metrics exposes for charts, as JSON. Rates are
    the deltas of two snapshots over their `time` difference."""
    return {
        "object": "stats",
        "time": time.time(),
        "policy": args.policy,
        "entry": args.entry,
        "models": list(args.models),
        "requests_active": active,
        "requests_total": metrics.requests_total,
        "requests_finished": dict(metrics.requests_finished),
        "prompt_tokens": metrics.prompt_tokens,
        "generation_tokens": {x: metrics.tokens.get(x, 0) for x in args.models},
        "hops": sum(metrics.hops.values()),
        "subservers": {
            x: {f: getattr(s, f) for f in _SUBSERVER_FIELDS} for x, s in sorted(metrics.stats.items())
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
