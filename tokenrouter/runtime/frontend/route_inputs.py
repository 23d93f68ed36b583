"""The route decisions' inputs of a request that asks for them (`"return_route_inputs": true`), as its
`routing.inputs` carries them: per completion token, the decisions that led to it, each `{"model", "values":
{input: value}}` (what the model's route expression read: its features, `uniform`, its routers' scores), with
`"to": MODEL` where the request went to another model after it and `"dropped": true` for a `drop` hop's
decision, whose token was discarded and rewritten by the next model (so it comes first at that position). A
token written by a model whose route block reads nothing has no decision: `[]`."""

from __future__ import annotations

from tokenrouter.runtime import messages as m


def token_decisions(out: m.TokenOut) -> list[tuple[int, dict]]:
    """(token index, decision) of each decision a subserver's TokenOut reports."""
    if out.route_inputs is None:
        return []
    if not out.token_ids:  # a drop hop: its decision is about the position the next model writes
        return [(out.index, _decision(out, out.route_inputs[0], dropped=True))]
    last = len(out.token_ids) - 1
    return [
        (out.index + i, _decision(out, values, hop=i == last))
        for i, values in enumerate(out.route_inputs[: len(out.token_ids)])
    ]


def _decision(out: m.TokenOut, values: dict, *, dropped: bool = False, hop: bool = True) -> dict:
    d: dict = {"model": out.model, "values": values}
    if out.hop_to is not None and hop:
        d["to"] = out.hop_to
    if dropped:
        d["dropped"] = True
    return d


def merge_late(inputs: list[list[dict]], pending: dict[int, list[dict]]) -> None:
    """Add to the tokens already taken (`inputs`, per token its decisions) the decisions that arrived after
    their token (a drop hop's, sent by one subserver, may reach the frontend after the next model's token)."""
    for idx in [i for i in pending if i < len(inputs)]:
        inputs[idx] = sorted(pending.pop(idx) + inputs[idx], key=lambda d: not d.get("dropped"))
