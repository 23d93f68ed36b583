"""Top-k / top-p sampling, the separate (torch) path of docs/ir.md: restrict the candidates of the
temperature-scaled distribution, then the same Gumbel-max draw as the fused kernels. Rows that do not
restrict (temperature 0, or top_k = 0 and top_p = 1) get -1: the route kernel samples those itself."""

from __future__ import annotations

import torch

from tokenrouter.runtime.rng import gumbel


def restricted_tokens(
    logits: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    x = logits.float()
    vocab = x.shape[-1]
    restrict = (temperature > 0) & ((top_k > 0) | (top_p < 1))
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    scaled = x / t[:, None]
    order = scaled.sort(dim=-1, descending=True)
    k = torch.where(
        top_k > 0, top_k.to(torch.int64).clamp(max=vocab), torch.full_like(top_k, vocab, dtype=torch.int64)
    )
    rank = torch.arange(vocab, device=x.device)[None, :]
    keep_sorted = rank < k[:, None]
    probs = torch.softmax(order.values, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly above each candidate
    keep_sorted &= (before < top_p[:, None]) | (rank == 0)
    keep = torch.zeros_like(keep_sorted).scatter(1, order.indices, keep_sorted)
    score = torch.where(keep, scaled + gumbel(seed, position, vocab), torch.full_like(scaled, float("-inf")))
    return torch.where(restrict, score.argmax(dim=-1), torch.full_like(position, -1))
