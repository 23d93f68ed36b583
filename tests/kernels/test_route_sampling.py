"""The two-stage draw of tokenrouter.runtime.sampling (chunk by cumulative mass, then Gumbel-max within the
chunk), which the route kernels implement: an exact sample from softmax(logits / T) across chunk
boundaries, plain Gumbel-max for a vocabulary of one chunk, and the same tokens as the per-row Python
reference over several chunks."""

from __future__ import annotations

import math

import torch
from route_cases import CASES
from route_inputs import mixed_state, random_logits
from route_reference import SAMPLE_CHUNK as REF_CHUNK
from route_reference import reference
from test_route_torch import assert_matches, plan_for

from tokenrouter.runtime.rng import uniform_int
from tokenrouter.runtime.route import RouteKernel
from tokenrouter.runtime.sampling import SAMPLE_CHUNK, sample


def _draws(logits_row: torch.Tensor, n: int, temperature: float, seed: int = 5) -> torch.Tensor:
    logits = logits_row[None].expand(n, -1).contiguous()
    return sample(logits, torch.full((n,), temperature), torch.zeros(n, dtype=torch.int64), torch.ones(n),
                  torch.full((n,), seed, dtype=torch.int64), torch.arange(n), restrict=False)  # fmt: skip


def test_chunk_size_is_the_documented_one():
    assert SAMPLE_CHUNK == REF_CHUNK == 2048


def test_empirical_distribution_across_chunks():
    vocab = 3 * SAMPLE_CHUNK + 100  # four chunks, the last one partial
    probs = {10: 0.3, 20: 0.2, 2500: 0.25, 6200: 0.15, 6243: 0.1}
    row = torch.full((vocab,), -30.0)
    for tok, p in probs.items():
        row[tok] = math.log(p)
    n = 6000
    toks = _draws(row, n, 1.0)
    freq = torch.bincount(toks, minlength=vocab).float() / n
    for tok, p in probs.items():
        assert abs(float(freq[tok]) - p) < 0.025, (tok, float(freq[tok]), p)
    # temperature 2 flattens: p ∝ sqrt(p)
    toks = _draws(row, n, 2.0, seed=9)
    z = sum(math.sqrt(p) for p in probs.values())
    freq = torch.bincount(toks, minlength=vocab).float() / n
    for tok, p in probs.items():
        assert abs(float(freq[tok]) - math.sqrt(p) / z) < 0.025, (tok, float(freq[tok]))


def test_one_chunk_is_plain_gumbel_max():
    vocab = SAMPLE_CHUNK
    row = torch.randn(vocab, generator=torch.Generator().manual_seed(3)) * 2
    toks = _draws(row, 20, 0.8, seed=11).tolist()
    for pos, tok in enumerate(toks):
        scores = [float(row[v]) / 0.8 - math.log(-math.log(min(max(uniform_int(11, pos, 0, v), 2**-24),
                                                                   1 - 2**-24))) for v in range(vocab)]  # fmt: skip
        assert tok == max(range(vocab), key=lambda v: (scores[v], -v))


def test_torch_renderer_matches_python_over_several_chunks():
    ir = CASES["citer_like"]()
    kernel = RouteKernel(plan_for(ir), "slm", "torch")
    rows, vocab = 24, 2 * SAMPLE_CHUNK + 300
    logits = random_logits(rows, vocab, seed=7, scale=1.0)
    state = mixed_state(rows)  # greedy, temperature, top-k and top-p rows
    result = kernel(logits, None, state, with_features=True)
    assert_matches(result, reference(ir, logits, state), ir)
    free = (state.temperature > 0) & (state.top_k == 0) & (state.top_p == 1)
    assert len(set((result.token[free] // SAMPLE_CHUNK).tolist())) > 1  # the draw left the first chunk
