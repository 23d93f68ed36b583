"""The one counter-based random generator of TokenRouter (see docs/ir.md, "Randomness").

Every random draw is a pure function of (seed, position, stream, index), so that a request's tokens and
routing decisions do not depend on batching, on which process runs it, or on the renderer (the torch
reference and the Triton kernel implement the same arithmetic on uint32).
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
K_SEED_LO = 0x9E3779B1
K_SEED_HI = 0x7FEB352D
K_POSITION = 0x85EBCA77
K_STREAM = 0xC2B2AE3D
K_INDEX = 0x27D4EB2F
STREAM_SAMPLE = 0
STREAM_UNIFORM = 1
STREAM_CHUNK = 2  # index 0: the chunk draw of temperature sampling (tokenrouter.runtime.sampling)
STREAM_GROUP = 3  # index j: chunk j's Gumbel noise in the "strided" sampler (runtime.sampling)
U_MIN = 2.0**-24
U_MAX = 1.0 - 2.0**-24


def fmix32_int(x: int) -> int:
    x &= MASK32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & MASK32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & MASK32
    x ^= x >> 16
    return x


def uniform_int(seed: int, position: int, stream: int, index: int) -> float:
    """Plain-Python reference: the draw in [0, 1)."""
    seed &= (1 << 64) - 1
    x = (
        (seed & MASK32) * K_SEED_LO
        + (seed >> 32) * K_SEED_HI
        + position * K_POSITION
        + stream * K_STREAM
        + index * K_INDEX
    ) & MASK32
    return (fmix32_int(x) >> 8) * 2.0**-24


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    # int64 tensors holding values in [0, 2^32); products fit in int64 before masking.
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & MASK32
    return x ^ (x >> 16)


def uniform(seed: torch.Tensor, position: torch.Tensor, stream: int, index: torch.Tensor) -> torch.Tensor:
    """Broadcasting torch version: int64 `seed`, `position`, `index` → float32 draws in [0, 1).

    `seed` holds the request's 64-bit seed as a signed int64 (two's complement); only its bit pattern counts.
    """
    seed_lo = seed & MASK32
    seed_hi = (seed >> 32) & MASK32
    x = (seed_lo * K_SEED_LO) & MASK32
    x = (x + ((seed_hi * K_SEED_HI) & MASK32)) & MASK32
    x = (x + ((position * K_POSITION) & MASK32)) & MASK32
    x = (x + (stream * K_STREAM) & MASK32) & MASK32
    x = (x + ((index * K_INDEX) & MASK32)) & MASK32
    return (_fmix32(x) >> 8).to(torch.float32) * (2.0**-24)


def gumbel(seed: torch.Tensor, position: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise [B, V] for sampling: −log(−log(u)), u clamped away from 0 and 1."""
    idx = torch.arange(vocab_size, device=seed.device, dtype=torch.int64)
    u = uniform(seed[:, None], position[:, None], STREAM_SAMPLE, idx[None, :]).clamp_(U_MIN, U_MAX)
    return -torch.log(-torch.log(u))
