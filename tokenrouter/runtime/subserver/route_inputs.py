"""The route decision's inputs, for the requests that ask (`SamplingSpec.route_inputs`): what the model's route
expression read at each step (its features, `uniform`, its routers' scores: `RouteResult.features`), per row as
`{name: value}`, sent with the token it decided on (`TokenOut.route_inputs`). Nothing of it is computed for a
step none of whose rows asks, nor for a model with no route block (it reads nothing)."""

from __future__ import annotations

import torch

from tokenrouter.runtime.subserver.req import Req


def wanted(rows: list[Req]) -> bool:
    """Whether the route kernel should report its features for this step."""
    return any(r.sampling.route_inputs for r in rows)


def note_route_inputs(rows: list[Req], features: dict[str, torch.Tensor] | None) -> None:
    """Keep on each row that asks its decision's inputs (None on the others, and where there are none)."""
    for r in rows:
        r.route_inputs = None
    if not features:
        return
    values = {name: t.float().tolist() for name, t in features.items()}  # one copy per input, asked for only
    for i, r in enumerate(rows):
        if r.sampling.route_inputs:
            r.route_inputs = {name: v[i] for name, v in values.items()}


def token_inputs(req: Req) -> list[dict[str, float]] | None:
    """The `route_inputs` of the TokenOut of this step's decision on `req`."""
    return None if req.route_inputs is None else [req.route_inputs]
