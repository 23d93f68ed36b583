"""A plain sequential reference of a policy: one request at a time, no batching, no KV cache.

Every step recomputes the current model's whole sequence with `forward_full` (teacher forcing, no cache),
runs the model's route kernel on that one row, and applies LANGUAGE.md's rule semantics directly:

- no rule fires: commit the token, stay;
- `-> T`: commit the token, continue on T; `-> T drop`: discard the token, T writes this position;
- `for K`: T writes K tokens ignoring its own rules, then the request goes back;
- finish when a committed token is EOS (unless ignore_eos) or a stop token ("stop"), or at max_tokens or the
  current model's context end ("length").

The executor (`offline.py`, `tokenrouter serve`) must produce the same tokens and per-token model trace under
greedy decoding, whatever the batching: that is the "routing is exact" test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from tokenrouter.runtime.messages import SamplingSpec

MAX_DROPS_IN_A_ROW = 1000  # a conditional drop cycle that never commits is a policy bug, not a hang


@dataclass(slots=True)
class ReferenceModel:
    """What the reference needs of a model: a cache-free full forward, its stop tokens and context size."""

    forward_full: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # ids [T] -> ([T, V], [T, H])
    eos_token_ids: tuple[int, ...]
    max_len: int

    @classmethod
    def from_engine(cls, engine) -> ReferenceModel:
        """The engine's own weights, run without its KV cache (`engine.forward_full`)."""
        return cls(engine.forward_full, tuple(engine.info.eos_token_ids), engine.info.max_len)


@dataclass(slots=True)
class ReferenceResult:
    token_ids: list[int] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # which model wrote each token
    hops: list[tuple[str, str]] = field(default_factory=list)
    finish_reason: str = ""


def reference_generate(
    plan: dict,
    models: dict[str, ReferenceModel],
    kernels: dict[str, Callable],
    prompt_ids: Sequence[int],
    sampling: SamplingSpec,
) -> ReferenceResult:
    rules = {
        name: [(r["target"], bool(r.get("drop", False)), int(r.get("for") or 0)) for r in route["rules"]]
        for name, route in plan["routes"].items()
    }
    tokens = list(prompt_ids)
    res = ReferenceResult()
    cur = plan["entry"]
    run_length, for_left, return_to, drops = 0, 0, None, 0

    while True:
        logits, hidden = models[cur].forward_full(torch.tensor(tokens, dtype=torch.int64))
        state = _state(logits.device, sampling, len(tokens), run_length, len(res.token_ids))
        out = kernels[cur](logits[-1:], hidden[-1:], state)
        tok, rule = int(out.token[0]), int(out.rule[0])
        hop = rules[cur][rule] if (for_left == 0 and rule >= 0) else None
        if hop is not None and hop[1]:  # drop
            drops += 1
            if drops > MAX_DROPS_IN_A_ROW:
                raise RuntimeError(f"{MAX_DROPS_IN_A_ROW} drop hand-offs in a row without a committed token")
            res.hops.append((cur, hop[0]))
            cur, run_length, for_left, return_to = hop[0], 0, hop[2], (cur if hop[2] else None)
            continue
        drops = 0
        tokens.append(tok)
        res.token_ids.append(tok)
        res.models.append(cur)
        run_length += 1
        if finish := _finish_reason(tok, len(tokens), len(res.token_ids), models[cur], sampling):
            res.finish_reason = finish
            return res
        if for_left > 0:
            for_left -= 1
            if for_left == 0:
                hop = (return_to, False, 0)
        if hop is not None:
            res.hops.append((cur, hop[0]))
            cur, run_length, for_left, return_to = hop[0], 0, hop[2], (cur if hop[2] else None)


def _state(device, sampling: SamplingSpec, position: int, run_length: int, generated: int):
    """The route kernel's state for the one request at this step."""
    from tokenrouter.runtime.route import RouteBatchState

    return RouteBatchState.make(
        1,
        device,
        seed=sampling.seed,
        position=position,
        temperature=float(sampling.temperature),
        top_k=sampling.top_k,
        top_p=float(sampling.top_p),
        run_length=run_length,
        generated=generated,
    )


def _finish_reason(
    tok: int, length: int, generated: int, m: ReferenceModel, sampling: SamplingSpec
) -> str | None:
    """ "stop" (a stop token, or EOS unless ignored), "length" (max_tokens, or the model's context), or None."""
    if tok in sampling.stop_token_ids or (not sampling.ignore_eos and tok in m.eos_token_ids):
        return "stop"
    if generated >= sampling.max_tokens or length >= m.max_len:
        return "length"
    return None
