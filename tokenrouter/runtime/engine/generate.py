"""Offline generation on one engine: a small continuous-batching loop (every unfinished request steps each
iteration; finished ones are released). Used by `tokenrouter generate` and by tests; the serving path has
its own scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenrouter.runtime.engine.base import Engine, StepInput
from tokenrouter.runtime.sampling import SamplingParams, SamplingTensors, sample


@dataclass(slots=True)
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated, including a stop/EOS token that ended it
    finish_reason: str  # "stop" | "length"


def generate(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    *,
    rid_prefix: str = "gen",
) -> list[GenerationResult]:
    """Generate for every prompt, batched. Requests are released when they finish (also on error)."""
    if len(prompts) != len(params):
        raise ValueError("one SamplingParams per prompt")
    eos = set(engine.info.eos_token_ids)
    rids = [f"{rid_prefix}-{i}" for i in range(len(prompts))]
    results = [GenerationResult(list(p), [], "") for p in prompts]
    pending = {i: list(p) for i, p in enumerate(prompts)}  # request index -> tokens to feed next
    try:
        while pending:
            order = list(pending)
            out = engine.forward([StepInput(rids[i], pending[i]) for i in order])
            st = SamplingTensors.from_params([params[i] for i in order], out.logits.device)
            positions = torch.tensor([engine.seq_len(rids[i]) for i in order], device=out.logits.device)
            tokens = sample(
                out.logits, st.temperature, st.top_k, st.top_p, st.seed, positions,
                restrict=st.restrict, all_greedy=st.all_greedy,
            ).tolist()  # fmt: skip
            for i, tok in zip(order, tokens, strict=True):
                res, p = results[i], params[i]
                res.token_ids.append(tok)
                if tok in p.stop_token_ids or (not p.ignore_eos and tok in eos):
                    res.finish_reason = "stop"
                elif len(res.token_ids) >= p.max_tokens or engine.seq_len(rids[i]) + 1 > engine.info.max_len:
                    res.finish_reason = "length"
                if res.finish_reason:
                    del pending[i]
                    engine.release(rids[i])
                else:
                    pending[i] = [tok]
    finally:
        for i in pending:
            engine.release(rids[i])
    return results
