"""Log-probabilities on a subserver: each sampled token's (`note_logprobs`, sampling.logprobs ≥ 0) and the
prompt's (sampling.prompt_logprobs ≥ 0: scored by the engine in the request's first step on its entry model,
`engine/scoring.py`, and sent with that step's outputs)."""

from __future__ import annotations

import torch

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.engine.base import StepOutput
from tokenrouter.runtime.subserver.req import Req


def note_logprobs(rows: list[Req], at, logits: torch.Tensor, token: torch.Tensor) -> None:
    """For each row that asks (sampling.logprobs = k ≥ 0), its token's log-probability and the k most likely
    tokens' under log_softmax of its logits (row `at[i]` of `logits`), as OpenAI reports them: the model's
    distribution, before temperature, top-k and top-p. Kept on the row until the token is emitted."""
    want = [i for i, r in enumerate(rows) if r.sampling.logprobs >= 0]
    for r in rows:
        r.logprobs = None
    if not want:
        return
    at = list(at)
    idx = torch.tensor([at[i] for i in want], device=logits.device)
    lp = torch.log_softmax(logits.index_select(0, idx).float(), dim=-1)
    chosen = lp.gather(
        1, token.index_select(0, torch.tensor(want, device=token.device)).to(lp.device)[:, None]
    )
    k = max(rows[i].sampling.logprobs for i in want)
    top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
    chosen, top_v, top_i = chosen[:, 0].tolist(), top_v.tolist(), top_i.tolist()
    for j, i in enumerate(want):
        n = rows[i].sampling.logprobs
        rows[i].logprobs = [chosen[j], [[t, v] for t, v in zip(top_i[j][:n], top_v[j][:n], strict=True)]]


def score_k(req: Req) -> int:
    """The row's `StepInput.prompt_logprobs`: k on the step that scores its prompt, else -1."""
    return req.sampling.prompt_logprobs if req.score_prompt else -1


def take_prompt_logprobs(rows: list[Req], step: StepOutput) -> None:
    """Keep each scored row's prompt logprobs from the step on the row, until its outputs are sent."""
    for r in rows:
        if r.score_prompt:
            r.prompt_logprobs = step.prompt_logprobs.get(r.rid)
            r.score_prompt = False


def prompt_outputs(rows: list[Req]) -> list[m.PromptLogprobs]:
    """The scored prompts of a step's rows (taken off the rows)."""
    out = []
    for r in rows:
        if r.prompt_logprobs is not None:
            out.append(m.PromptLogprobs(r.rid, r.prompt_logprobs))
            r.prompt_logprobs = None
    return out
