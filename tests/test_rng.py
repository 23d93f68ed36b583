import torch

from tokenrouter.runtime.rng import gumbel, uniform, uniform_int


def test_torch_matches_python_reference():
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**63), 2**63 - 1, (64,), generator=g)
    pos = torch.randint(0, 2**20, (64,), generator=g)
    idx = torch.randint(0, 200_000, (64,), generator=g)
    for stream in (0, 1):
        got = uniform(seeds, pos, stream, idx).tolist()
        want = [
            uniform_int(int(s) & (2**64 - 1), int(p), stream, int(i))
            for s, p, i in zip(seeds, pos, idx, strict=True)
        ]
        assert got == want


def test_draws_are_uniform_and_distinct_per_stream():
    seed = torch.full((1,), 42)
    u0 = uniform(seed, torch.tensor([7]), 0, torch.arange(100_000))
    u1 = uniform(seed, torch.tensor([7]), 1, torch.arange(100_000))
    assert 0.0 <= float(u0.min()) and float(u0.max()) < 1.0
    assert abs(float(u0.mean()) - 0.5) < 0.01
    assert not torch.equal(u0, u1)


def test_gumbel_shape_and_finite():
    noise = gumbel(torch.tensor([1, 2]), torch.tensor([0, 5]), 1000)
    assert noise.shape == (2, 1000) and torch.isfinite(noise).all()
