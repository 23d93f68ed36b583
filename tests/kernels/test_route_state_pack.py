"""`RouteBatchState.pack` (one host-to-device copy) builds exactly the state `make` builds column by column."""

from __future__ import annotations

import random

import pytest
import torch

from tokenrouter.runtime.route import RouteBatchState

COLUMNS = ("seed", "position", "temperature", "top_k", "top_p", "run_length", "generated")


def random_rows(rng: random.Random, rows: int) -> dict:
    seeds = [None, 0, 1, 2**63 - 1, 2**63, 2**64 - 1, -1, -(2**63)]
    return {
        "seed": [rng.choice(seeds) if rng.random() < 0.3 else rng.getrandbits(64) for _ in range(rows)],
        "position": [rng.randrange(1, 1 << 40) for _ in range(rows)],
        "temperature": [rng.choice([0.0, rng.uniform(0.01, 2.5), 1.0, 0.1]) for _ in range(rows)],
        "top_k": [rng.choice([0, 0, 1, rng.randrange(2, 200_000)]) for _ in range(rows)],
        "top_p": [rng.choice([1.0, rng.random(), 0.95, 1e-9]) for _ in range(rows)],
        "run_length": [rng.randrange(0, 5000) for _ in range(rows)],
        "generated": [rng.randrange(0, 1 << 33) for _ in range(rows)],
    }


def assert_same(a: RouteBatchState, b: RouteBatchState) -> None:
    for name in COLUMNS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.device == y.device, name
        assert x.is_contiguous() and y.is_contiguous(), name
        # bit patterns, not values: the float columns must round the same way, seeds must wrap the same way
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), name
    assert (a.any_sampling, a.any_restricted) == (b.any_sampling, b.any_restricted)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 64])
def test_pack_equals_make_for_random_rows(rows):
    rng = random.Random(rows)
    for _ in range(50):
        cols = random_rows(rng, rows)
        assert_same(RouteBatchState.pack("cpu", **cols), RouteBatchState.make(rows, "cpu", **cols))


def test_pack_hints_follow_the_rows_that_sample():
    greedy_restricted = dict(seed=[1, 2], position=[5, 6], temperature=[0.0, 0.8], top_k=[5, 0],
                             top_p=[0.5, 1.0], run_length=[0, 0], generated=[0, 0])  # fmt: skip
    state = RouteBatchState.pack("cpu", **greedy_restricted)
    assert state.any_sampling and not state.any_restricted  # only a greedy row restricts: nothing to cut
    state = RouteBatchState.pack("cpu", **{**greedy_restricted, "top_p": [0.5, 0.9]})
    assert state.any_sampling and state.any_restricted
    state = RouteBatchState.pack("cpu", **{**greedy_restricted, "temperature": [0.0, 0.0]})
    assert not state.any_sampling and not state.any_restricted


def test_pack_columns_do_not_alias_each_other():
    cols = random_rows(random.Random(7), 4)
    state = RouteBatchState.pack("cpu", **cols)
    state.position.add_(1)  # a kernel may use a column as scratch: the others must not move
    ref = RouteBatchState.make(4, "cpu", **cols)
    assert torch.equal(state.position, ref.position + 1)
    for name in COLUMNS:
        if name != "position":
            assert torch.equal(getattr(state, name), getattr(ref, name)), name


def test_pack_refuses_ragged_or_out_of_range_columns():
    cols = random_rows(random.Random(3), 3)
    with pytest.raises(ValueError, match="differ in length"):
        RouteBatchState.pack("cpu", **{**cols, "top_p": [1.0, 1.0]})
    with pytest.raises(ValueError, match="out of its column's range"):
        RouteBatchState.pack("cpu", **{**cols, "top_k": [0, 2**31, 0]})


def test_pack_of_no_rows():
    state = RouteBatchState.pack("cpu", **{name: [] for name in COLUMNS})
    assert all(getattr(state, name).shape == (0,) for name in COLUMNS)
    assert state.any_sampling is False and state.any_restricted is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pack_equals_make_on_cuda():
    cols = random_rows(random.Random(11), 8)
    assert_same(RouteBatchState.pack("cuda", **cols), RouteBatchState.make(8, "cuda", **cols))


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7])
def test_pack_columns_start_at_16_byte_boundaries(rows):
    """Like tensors of their own: Triton specialises pointer arguments on 16-byte alignment, so a column at
    another offset would compile another variant of the route kernel mid-serving."""
    state = RouteBatchState.pack("cpu", **random_rows(random.Random(rows), rows))
    base = state.seed.data_ptr()
    for name in COLUMNS:
        assert (getattr(state, name).data_ptr() - base) % 16 == 0, name


def test_packer_equals_pack_across_steps_and_row_counts():
    """The scheduler's `RouteStatePacker` reuses its buffers: every step's state is still `pack`'s, bit for bit,
    whatever the row counts before it, and a column a kernel used as scratch does not leak into the next."""
    from tokenrouter.runtime.route.state import RouteStatePacker

    rng = random.Random(11)
    packer = RouteStatePacker("cpu")
    for rows in [1, 4, 4, 3, 1, 64, 4, 1]:
        cols = random_rows(rng, rows)
        state = packer.pack(**cols)
        assert_same(state, RouteBatchState.pack("cpu", **cols))
        state.position.add_(7)  # scratch use
    assert_same(
        packer.pack(**{n: [] for n in COLUMNS}), RouteBatchState.pack("cpu", **{n: [] for n in COLUMNS})
    )
    with pytest.raises(ValueError, match="differ in length"):
        packer.pack(**{**random_rows(rng, 3), "top_p": [1.0]})
    with pytest.raises(ValueError, match="out of its column's range"):
        packer.pack(**{**random_rows(rng, 3), "top_k": [0, 2**31, 0]})
    cols = random_rows(rng, 3)  # a refused step leaves the next one exact
    assert_same(packer.pack(**cols), RouteBatchState.pack("cpu", **cols))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packer_on_cuda_equals_pack():
    from tokenrouter.runtime.route.state import RouteStatePacker

    rng = random.Random(12)
    packer = RouteStatePacker("cuda")
    for rows in [1, 4, 4, 4, 4, 4, 2, 64]:  # more steps than the ring of pinned buffers
        cols = random_rows(rng, rows)
        assert_same(packer.pack(**cols), RouteBatchState.pack("cuda", **cols))
