"""Logits and batch states for the route-kernel tests: random rows, ties, and extreme values."""

from __future__ import annotations

import torch

from tokenrouter.runtime.route import RouteBatchState

SEEDS = [0, 1, 2**63 + 5, 2**64 - 1, 123456789, 42, 7, 2**40 + 3]


def random_logits(rows: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * scale


def tie_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Small integers: many exact ties, including for the maximum (margin 0, lowest-index argmax)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 3, (rows, vocab), generator=g).float()
    x[0] = 1.0  # a fully flat row
    x[1, 5] = x[1, vocab - 3] = 9.0  # two maxima far apart
    return x


def offset_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Ordinary rows moved by large offsets, on both sides of the Triton kernel's |max| <= 4096 bound: below
    it the sums are relative to a rounded max * log2(e) and corrected after the loop, above it they are
    summed again relative to the max itself."""
    g = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([4000.0, -4000.0, 5000.0, -5000.0, 4090.0, 300.0])
    return torch.randn(rows, vocab, generator=g) * 4 + offsets[torch.arange(rows) % len(offsets)][:, None]


def extreme_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """-inf entries (masked tokens), huge values, and rows whose spread overflows x - max."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g) * 4
    x[0, ::2] = float("-inf")  # half the vocabulary masked
    x[1, :] = float("-inf")
    x[1, vocab // 2] = 3.0  # one live token
    x[1, vocab - 1] = 2.5
    x[2] = x[2] * 1e4  # huge spread: a one-hot distribution
    x[3, :] = 3.0e38
    x[3, 7] = -3.0e38  # x - max overflows to -inf
    x[4, : vocab // 3] = float("-inf")
    x[4, vocab // 3 :] = 1.0e30
    x[5, 3] = 88.0
    return x


def mixed_state(rows: int, *, position_base: int = 10, restricted: bool = True) -> RouteBatchState:
    """Greedy, temperature and (optionally) top-k / top-p rows, varied seeds, positions and counters."""
    temps = [0.0, 1.0, 0.7, 1.5, 0.0, 2.0, 1.0, 0.3]
    top_k = [0, 0, 0, 0, 5, 0, 3, 0] if restricted else [0] * 8
    top_p = [1.0, 1.0, 1.0, 0.9, 1.0, 0.5, 1.0, 1.0] if restricted else [1.0] * 8
    pick = lambda vals: [vals[i % len(vals)] for i in range(rows)]  # noqa: E731
    return RouteBatchState.make(
        rows,
        seed=pick(SEEDS),
        position=[position_base + 3 * i for i in range(rows)],
        temperature=pick(temps),
        top_k=pick(top_k),
        top_p=pick(top_p),
        run_length=[i % 4 for i in range(rows)],
        generated=[(5 * i) % 9 for i in range(rows)],
    )
