import math

import pytest
import torch

from tokenrouter.runtime.rng import uniform_int
from tokenrouter.runtime.sampling import (
    DEFAULT_SAMPLER,
    SamplingParams,
    SamplingTensors,
    sample,
    sample_params,
    seed_to_int64,
)


def test_greedy_ties_go_to_lowest_index():
    logits = torch.tensor([[0.0, 2.0, 5.0, 5.0, 5.0], [1.0, 1.0, 1.0, 1.0, 1.0], [-1.0, 7.0, 0.0, 7.0, 7.0]])
    params = [SamplingParams(temperature=0.0)] * 3
    assert sample_params(logits, params, [0, 1, 2]).tolist() == [2, 0, 1]
    # greedy ignores seed and top-k/top-p
    params = [SamplingParams(temperature=0.0, seed=5, top_k=1, top_p=0.1)] * 3
    assert sample_params(logits, params, [0, 1, 2]).tolist() == [2, 0, 1]


def _gumbel(seed: int, position: int, stream: int, index: int) -> float:
    return -math.log(-math.log(min(max(uniform_int(seed, position, stream, index), 2.0**-24), 1 - 2.0**-24)))


ROWS = dict(  # a vocabulary of fewer than SAMPLE_CHUNK ids, four rows of seeds, temperatures, positions
    seeds=[3, 2**63 + 5, 12345678901234, 0], temps=[1.0, 0.7, 1.3, 2.0], positions=[0, 9, 100, 4096]
)


def _rows(vocab: int = 37):
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1)) * 2
    params = [
        SamplingParams(temperature=t, seed=s) for t, s in zip(ROWS["temps"], ROWS["seeds"], strict=True)
    ]
    return logits, params, ROWS["positions"]


def test_cdf_matches_reference_gumbel_max():
    """ "cdf" over a vocabulary of one chunk is plain Gumbel-max (stream 0)."""
    logits, params, positions = _rows()
    got = sample_params(logits, params, positions, sampler="cdf").tolist()
    for row in range(4):
        seed, pos, t = ROWS["seeds"][row], positions[row], ROWS["temps"][row]
        scores = [float(logits[row, v]) / t + _gumbel(seed, pos, 0, v) for v in range(logits.shape[1])]
        assert got[row] == max(range(len(scores)), key=lambda v: (scores[v], -v))


def test_strided_matches_reference():
    """ "strided" (the default) over a vocabulary of one span: chunk j = ids 8j..8j+7, chosen by Gumbel-max
    (stream 3) over the log chunk masses, then Gumbel-max (stream 0) within it."""
    logits, params, positions = _rows()
    assert DEFAULT_SAMPLER == "strided"
    got = sample_params(logits, params, positions).tolist()
    assert got == sample_params(logits, params, positions, sampler="strided").tolist()
    vocab = logits.shape[1]
    for row in range(4):
        seed, pos, t = ROWS["seeds"][row], positions[row], ROWS["temps"][row]
        z = [float(logits[row, v]) / t for v in range(vocab)]
        m = max(z)
        groups = range(-(-vocab // 8))
        mass = [sum(math.exp(z[v] - m) for v in range(8 * j, min(8 * j + 8, vocab))) for j in groups]
        j = max(groups, key=lambda j: (math.log(mass[j]) + _gumbel(seed, pos, 3, j), -j))
        ids = range(8 * j, min(8 * j + 8, vocab))
        assert got[row] == max(ids, key=lambda v: (z[v] + _gumbel(seed, pos, 0, v), -v))


def test_samplers_differ_for_the_same_seed():
    """The two draws are different functions of the seed: which one is the default matters."""
    logits, params, positions = _rows(vocab=300)
    params, positions = params * 10, positions * 10
    positions = [p + i for i, p in enumerate(positions)]
    assert not torch.equal(
        sample_params(logits.repeat(10, 1), params, positions, sampler="cdf"),
        sample_params(logits.repeat(10, 1), params, positions, sampler="strided"),
    )


def test_seed_determinism_and_batch_independence():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 200, generator=g)
    params = [SamplingParams(temperature=1.0, seed=s, top_p=0.9) for s in (1, 2, 3, 1, 1, 9)]
    pos = [5, 5, 5, 5, 6, 5]
    a = sample_params(logits, params, pos)
    b = sample_params(logits, params, pos)
    assert torch.equal(a, b)
    alone = [int(sample_params(logits[i : i + 1], [params[i]], [pos[i]])[0]) for i in range(6)]
    assert a.tolist() == alone
    # a different seed or position draws different noise: over many positions tokens differ somewhere
    row = logits[:1].expand(50, -1)
    s1 = sample_params(row, [SamplingParams(seed=1)] * 50, range(50))
    s2 = sample_params(row, [SamplingParams(seed=2)] * 50, range(50))
    assert not torch.equal(s1, s2)


def test_top_k_restricts_support():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 50, generator=g).expand(400, -1).contiguous()
    top3 = set(torch.topk(logits[0], 3).indices.tolist())
    toks = sample_params(logits, [SamplingParams(temperature=5.0, top_k=3, seed=7)] * 400, range(400))
    assert set(toks.tolist()) == top3  # every one of the 3 appears at a high temperature, nothing else
    toks = sample_params(logits[:50], [SamplingParams(temperature=5.0, top_k=1, seed=7)] * 50, range(50))
    assert set(toks.tolist()) == {int(logits[0].argmax())}


def test_top_p_restricts_support():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None].expand(300, -1).contiguous()
    toks = sample_params(logits, [SamplingParams(temperature=1.0, top_p=0.79, seed=11)] * 300, range(300))
    assert set(toks.tolist()) == {0, 1}  # 0.5 < 0.79, 0.5 + 0.3 reaches it
    toks = sample_params(logits, [SamplingParams(temperature=1.0, top_p=0.81, seed=11)] * 300, range(300))
    assert set(toks.tolist()) == {0, 1, 2}
    toks = sample_params(logits[:50], [SamplingParams(temperature=1.0, top_p=0.01, seed=11)] * 50, range(50))
    assert set(toks.tolist()) == {0}


def test_empirical_distribution_follows_softmax():
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    n = 4000
    logits = probs.log()[None].expand(n, -1).contiguous()
    toks = sample_params(logits, [SamplingParams(temperature=1.0, seed=99)] * n, range(n))
    freq = torch.bincount(toks, minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.03)


def test_pure_tensor_function_matches_params_helper():
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(4))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(seed=-1, top_k=5),
        SamplingParams(seed=2**64 - 1),
    ]
    st = SamplingTensors.from_params(params, "cpu")
    pos = torch.tensor([1, 2, 3])
    assert st.seed.tolist() == [0, -1, -1]  # -1 and 2^64-1 are the same bit pattern
    assert torch.equal(
        sample(logits, st.temperature, st.top_k, st.top_p, st.seed, pos),
        sample_params(logits, params, [1, 2, 3]),
    )
    assert seed_to_int64(2**63) == -(2**63)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": 2**64}, "seed"),
        ({"seed": "x"}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop_token_ids": (1, -2)}, "stop_token_ids"),
    ],
)
def test_params_validation(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SamplingParams(**kwargs)


def test_sampling_without_seed_is_an_error():
    with pytest.raises(ValueError, match="seed"):
        SamplingTensors.from_params([SamplingParams(temperature=1.0)], "cpu")
