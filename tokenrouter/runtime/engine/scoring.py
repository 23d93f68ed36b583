"""Prompt scoring (`StepInput.prompt_logprobs`): the log-probability of each token of a row given the tokens
before it, and the most likely tokens at each position, from the step that computes the row's whole sequence.

The engine runs such a step eagerly (no CUDA graph) with the model's output rows widened: after each row's last
position, every position of the scored rows but their last (`score_plan`), so that one forward gives the usual
last-position logits and the scored positions' logits. A step without a scored row is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# positions whose log-softmax is taken at once (float32 [CHUNK, vocab]): bounds the step's extra memory
CHUNK = 512


@dataclass(slots=True)
class ScorePlan:
    """The scored rows of one step: (rid, first output row of its positions, positions, k) each; the input
    positions whose logits the model also returns, and the token each of them predicts."""

    rows: list[tuple[str, int, int, int]]
    positions: torch.Tensor  # int64 [S]: indices into the step's input tokens
    targets: torch.Tensor  # int64 [S]: input token at position + 1


def score_plan(rows: Sequence, input_ids: list[int], extend_lens: list[int]) -> ScorePlan | None:
    """The plan of a step whose rows (`StepInput`s, in order) ran `extend_lens` tokens each from `input_ids`;
    None when no row asks."""
    spans, positions, start = [], [], 0
    for row, n in zip(rows, extend_lens, strict=True):
        if row.prompt_logprobs >= 0:
            spans.append((row.rid, len(positions), n - 1, row.prompt_logprobs))
            positions.extend(range(start, start + n - 1))
        start += n
    if not spans:
        return None
    pos = torch.tensor(positions, dtype=torch.int64)
    return ScorePlan(spans, pos, torch.tensor(input_ids, dtype=torch.int64)[pos + 1])


def score(plan: ScorePlan, logits: torch.Tensor) -> dict[str, list]:
    """Each scored row's entries (`StepOutput.prompt_logprobs`) from the logits of its positions (`logits`: the
    model's extra output rows, in the plan's order), in float32 chunks of CHUNK positions."""
    k = max(r[3] for r in plan.rows)
    chosen, top_v, top_i = [], [], []
    targets = plan.targets.to(logits.device)
    for a in range(0, logits.shape[0], CHUNK):
        lp = torch.log_softmax(logits[a : a + CHUNK].float(), dim=-1)
        chosen += lp.gather(1, targets[a : a + CHUNK, None])[:, 0].tolist()
        v, i = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
        top_v += v.tolist()
        top_i += i.tolist()
    out = {}
    for rid, first, n, kk in plan.rows:
        out[rid] = [
            [chosen[j], [[t, x] for t, x in zip(top_i[j][:kk], top_v[j][:kk], strict=True)]]
            for j in range(first, first + n)
        ]
    return out
