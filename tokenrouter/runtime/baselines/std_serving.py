"""The `std-serving` baseline: every hop is a new request to a plain prefix-caching server.

This is how token routing runs on standard servers (vLLM/SGLang with prefix caching, one per model): the
router sends each hop to the other model's server as a brand-new request carrying the whole text so far.
Compared with TokenRouter's subservers, which hold a request's KV while it is away and receive only the
tokens written elsewhere, `StdServingScheduler`

- sends the **whole sequence** on every hop (`start = 0`, no `seen` map: the receiver knows nothing);
- **forgets** the request when it leaves: its KV is released into the engine's prefix cache
  (`PrefixCachingEngine`, `prefix_cache.py`, the same cache every mode uses), not held;
- on arrival, starts it as a new request: the engine matches the longest cached prefix and prefills the
  rest, so the cost of prefix matching and re-prefill is paid on every hop.
Standard servers do not delay batches: `modes.prepare` sets every batch threshold to 1 for this mode.
Routing semantics are unchanged (the route kernel samples with the request's seed and position), so the
tokens and the per-token model trace equal TokenRouter's.
"""

from __future__ import annotations

import msgspec

from tokenrouter.runtime.subserver.req import Req
from tokenrouter.runtime.subserver.scheduler import Scheduler


class StdServingScheduler(Scheduler):
    def _hop(self, req: Req, *args, **kwargs):  # the hop's description is passed through as is
        dest, msg = super()._hop(req, *args, **kwargs)
        msg = msgspec.structs.replace(msg, start=0, tokens=list(req.tokens), seen={})
        self.reqs.pop(req.rid, None)  # the request left this server; it may come back as a new one
        self.engine.release(req.rid)  # into the prefix cache
        return dest, msg


def load_std_serving(
    plan: dict, model: str, device: str, extra: dict | None = None, *, max_batch: int = 256, progress=None
):
    """(engine, scheduler) of one model for the std-serving mode: the embedded engine, with its prefix cache
    unless `extra` turns it off (`prefix_cache=False`). `progress`: as `load_model_runtime`'s."""
    from tokenrouter.runtime.subserver.loading import load_model_runtime

    kind = plan["models"][model].get("engine", "embedded")
    if kind != "embedded":
        raise ValueError(f"model {model!r}: the std-serving mode needs the embedded engine, not {kind!r}")
    engine, kernel = load_model_runtime(
        plan, model, device, warm_rows=max_batch, progress=progress, **(extra or {})
    )
    return engine, StdServingScheduler(model, plan, engine, kernel, max_batch=max_batch)
