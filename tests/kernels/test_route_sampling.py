"""The two-stage draws of tokenrouter.runtime.sampling, which the route kernels implement: "cdf" (chunk by
cumulative mass, then Gumbel-max within the chunk) and "strided" (chunk of ids v with (v mod 2048) // 8 == j
by Gumbel-max over log chunk masses, then Gumbel-max within it). Each is an exact sample from
softmax(logits / T) across chunks and spans (a chi-square test), "cdf" is plain Gumbel-max for a vocabulary
of one chunk, and both give the per-row Python reference's tokens over several chunks. The default sampler
("strided") is one constant that the runtime, the compiler (which never imports the runtime) and the Python
reference each write out; every path that samples with it gives the same tokens for a seed."""

from __future__ import annotations

import math

import pytest
import torch
from route_cases import CASES
from route_inputs import mixed_state, random_logits
from route_reference import DEFAULT_SAMPLER as REF_DEFAULT
from route_reference import SAMPLE_CHUNK as REF_CHUNK
from route_reference import reference
from scipy.stats import chisquare
from test_route_torch import assert_matches, plan_for

from tokenrouter.compiler.kernels import DEFAULT_SAMPLER as RENDER_DEFAULT
from tokenrouter.compiler.kernels import SAMPLERS as RENDER_SAMPLERS
from tokenrouter.compiler.kernels import render_route_kernel
from tokenrouter.runtime.rng import uniform_int
from tokenrouter.runtime.route import RouteKernel
from tokenrouter.runtime.sampling import DEFAULT_SAMPLER, SAMPLE_CHUNK, SAMPLERS, sample


def _draws(
    logits_row: torch.Tensor, n: int, temperature: float, seed: int = 5, sampler: str = DEFAULT_SAMPLER
):
    logits = logits_row[None].expand(n, -1).contiguous()
    return sample(logits, torch.full((n,), temperature), torch.zeros(n, dtype=torch.int64), torch.ones(n),
                  torch.full((n,), seed, dtype=torch.int64), torch.arange(n), restrict=False,
                  sampler=sampler)  # fmt: skip


def test_chunk_size_is_the_documented_one():
    assert SAMPLE_CHUNK == REF_CHUNK == 2048


def test_one_default_sampler():
    """The runtime's, the compiler's and the Python reference's default and list of samplers agree, and the
    renderers emit the default when none is named."""
    assert DEFAULT_SAMPLER == RENDER_DEFAULT == REF_DEFAULT == "strided"
    assert SAMPLERS == RENDER_SAMPLERS and DEFAULT_SAMPLER in SAMPLERS
    ir = CASES["citer_like"]()
    for backend in ("torch", "triton"):
        assert f"SAMPLER = {DEFAULT_SAMPLER!r}" in render_route_kernel(ir, backend)
    assert RouteKernel(plan_for(ir), "slm", "torch").sampler == DEFAULT_SAMPLER


def test_default_is_the_same_on_every_path():
    """For the same seeds and positions, with no sampler named anywhere: the torch-rendered route kernel
    (its own draw for free rows, `sample` for top-k / top-p rows), `sample`, `sample_params` (the engines'
    offline generation calls `sample` the same way) and the Python reference give the same tokens, those of
    the default sampler and not of the other one."""
    ir = CASES["citer_like"]()
    rows, vocab = 24, 2 * SAMPLE_CHUNK + 300
    logits = random_logits(rows, vocab, seed=5, scale=1.0)
    state = mixed_state(rows)
    kernel = RouteKernel(plan_for(ir), "slm", "torch")(logits, None, state).token
    via_sample = sample(logits, state.temperature, state.top_k, state.top_p, state.seed, state.position)
    assert torch.equal(kernel, via_sample)
    assert kernel.tolist() == [r["token"] for r in reference(ir, logits, state)]
    assert torch.equal(kernel, sample(logits, state.temperature, state.top_k, state.top_p, state.seed,
                                      state.position, sampler=DEFAULT_SAMPLER))  # fmt: skip
    (other,) = (s for s in SAMPLERS if s != DEFAULT_SAMPLER)
    assert not torch.equal(kernel, sample(logits, state.temperature, state.top_k, state.top_p, state.seed,
                                          state.position, sampler=other))  # fmt: skip


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


@pytest.mark.parametrize("sampler", ["cdf", "strided"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chi_square_against_softmax(sampler, temperature):
    """Tokens in the same "cdf" chunk and in the same "strided" chunk (ids 8 apart in one span, 2048 apart
    across spans), in different chunks of both, and a partial last span; the rest of the vocabulary is one
    category. 8000 draws (positions 0..7999); at the 1e-3 level the test would fail once in 1000 seeds."""
    vocab = 2 * SAMPLE_CHUNK + 300
    probs = {0: 0.2, 3: 0.05, 8: 0.1, 2048: 0.15, 2056: 0.05, 1000: 0.1, 4100: 0.1, 4099: 0.05, 3000: 0.1}
    row = torch.randn(vocab, generator=torch.Generator().manual_seed(1)) - 12.0  # the rest: ~5 % at T = 1
    for tok, p in probs.items():
        row[tok] = math.log(p)
    want = torch.softmax(row.double() / temperature, 0)
    n = 8000
    toks = _draws(row, n, temperature, seed=3, sampler=sampler)
    ids = torch.tensor(sorted(probs))
    counts = torch.bincount(toks, minlength=vocab).double()
    observed = torch.cat([counts[ids], (n - counts[ids].sum())[None]])
    expected = torch.cat([want[ids], (1 - want[ids].sum())[None]]) * n
    assert float(expected.min()) > 5  # the chi-square approximation holds
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3, (observed.tolist(), expected.tolist())


def test_strided_chunks_are_residues_of_the_span():
    """With all the mass on ids 5 and 2048 + 5 (the same "strided" chunk, different spans), both are drawn,
    and half the time each: the chunk's ids are found in every span."""
    row = torch.full((3 * SAMPLE_CHUNK,), -50.0)
    row[5] = row[SAMPLE_CHUNK + 5] = 0.0
    toks = _draws(row, 2000, 1.0, seed=8, sampler="strided")
    assert set(toks.tolist()) == {5, SAMPLE_CHUNK + 5}
    assert abs(float((toks == 5).double().mean()) - 0.5) < 0.05


def test_one_chunk_is_plain_gumbel_max():
    """ "cdf" only: "strided" first draws one of 256 chunks of 8 ids, even in a vocabulary of one span."""
    vocab = SAMPLE_CHUNK
    row = torch.randn(vocab, generator=torch.Generator().manual_seed(3)) * 2
    toks = _draws(row, 20, 0.8, seed=11, sampler="cdf").tolist()
    for pos, tok in enumerate(toks):
        scores = [float(row[v]) / 0.8 - math.log(-math.log(min(max(uniform_int(11, pos, 0, v), 2**-24),
                                                                   1 - 2**-24))) for v in range(vocab)]  # fmt: skip
        assert tok == max(range(vocab), key=lambda v: (scores[v], -v))


@pytest.mark.parametrize("sampler", ["cdf", "strided"])
def test_torch_renderer_matches_python_over_several_chunks(sampler):
    ir = CASES["citer_like"]()
    kernel = RouteKernel(plan_for(ir), "slm", "torch", sampler=sampler)
    rows, vocab = 24, 2 * SAMPLE_CHUNK + 300
    logits = random_logits(rows, vocab, seed=7, scale=1.0)
    state = mixed_state(rows)  # greedy, temperature, top-k and top-p rows
    result = kernel(logits, None, state, with_features=True)
    assert_matches(result, reference(ir, logits, state, sampler=sampler), ir)
    free = (state.temperature > 0) & (state.top_k == 0) & (state.top_p == 1)
    assert len(set((result.token[free] // SAMPLE_CHUNK).tolist())) > 1  # the draw left the first chunk
