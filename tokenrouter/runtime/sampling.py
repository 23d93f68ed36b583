"""Token sampling: greedy, temperature, top-k, top-p, with the per-request seed (docs/ir.md, "Randomness").

`sample` is a pure function of tensors (logits, per-row parameters, positions), so the route-kernel
renderers and every engine produce the same token for the same request whatever the batching:
- temperature 0: argmax of the logits, ties to the lowest index;
- temperature T > 0: top-k, then top-p (on softmax(logits / T), after top-k) restrict the candidates
  (the rest become −inf), then a two-stage draw that needs random numbers for one chunk only. There are two
  such draws (SAMPLERS), both exact samples from softmax(logits / T) but giving different tokens for the
  same seed; DEFAULT_SAMPLER, "strided", is the one every path uses unless told otherwise (route kernels of
  both renderers, their top-k / top-p path, `sample`, the engines' offline generation, the scheduler), so a
  seed gives the same tokens everywhere. "strided" is the default because it measured faster in the fused
  Triton kernel (H200, batch 64); "cdf" stays selectable wherever a sampler is.
  "strided" (the default):
  1. chunk j (0 <= j < SAMPLE_CHUNK / SAMPLE_GROUP = 256) holds the ids v with
     (v mod SAMPLE_CHUNK) // SAMPLE_GROUP == j: SAMPLE_GROUP = 8 consecutive ids in every span of
     SAMPLE_CHUNK ids (594 ids at 151,936); its mass
     w_j = Σ_{v in j} exp(logits_v / T − max_v logits_v / T); the chunk is the Gumbel-max
     argmax_j(log w_j − log(−log u_j)) with u_j = u(seed, position, stream 3, j) (ties: the lowest j);
  2. within it, Gumbel-max: argmax_v(logits_v / T − log(−log u_v)) with
     u_v = u(seed, position, stream 0, v) from `tokenrouter.runtime.rng` (v the vocabulary id).
  P(v) = (w_j / Σ w) · (p_v / w_j) = softmax(logits / T)_v: an exact sample. A fused kernel gets the chunk
  masses for free: they are its per-column sums (v mod SAMPLE_CHUNK) over the row, reduced once per program
  instead of per tile, and the chunk choice is a max, so no cumulative sum and no chunk table; two
  implementations differ only when two chunk scores or two Gumbel scores tie to float32 rounding.
  "cdf" (the alternative):
  1. the vocabulary is cut into chunks of SAMPLE_CHUNK consecutive ids; chunk c has mass w_c as above;
     with u = u(seed, position, stream 2, 0), the chunk is the first c whose cumulative mass
     Σ_{c' <= c} w_c' exceeds u · Σ w (if rounding leaves none, the last chunk with mass > 0);
  2. within that chunk, Gumbel-max as in "strided" stage 2 (stream 0, index v).
  P(v) = (w_c / Σ w) · (p_v / w_c) again. With a vocabulary of at most SAMPLE_CHUNK ids it is plain
  Gumbel-max. Two implementations agree on the token except when u falls within float-summation error of a
  chunk boundary (the fused kernel sums in another order; about 1e-5 of the draws at 75 chunks) or two
  Gumbel scores tie to float32 rounding.
Top-k keeps the k largest logits; among equal logits the lower index wins a place. Top-p keeps the shortest
prefix of the candidates sorted by descending probability (ties by index) whose mass reaches p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenrouter.runtime.rng import STREAM_CHUNK, STREAM_GROUP, STREAM_SAMPLE, U_MAX, U_MIN, uniform

SAMPLE_CHUNK = 2048  # ids per chunk of the two-stage draw; part of the sampler's definition
SAMPLE_GROUP = 8  # the "strided" sampler: consecutive ids of one chunk in each span of SAMPLE_CHUNK ids
SAMPLERS = ("cdf", "strided")  # the two-stage draws (module docstring)
DEFAULT_SAMPLER = "strided"  # every path's sampler unless told otherwise (module docstring)
SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1


@dataclass(slots=True)
class SamplingParams:
    """One request's sampling settings. `top_k` 0 = off; `top_p` 1.0 = off; `seed` None = to be drawn by
    whoever admits the request (the frontend). `max_tokens` counts generated tokens."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float):
            raise ValueError(f"temperature must be a number, got {self.temperature!r}")
        if not self.temperature >= 0.0 or self.temperature == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float):
            raise ValueError(f"top_p must be a number, got {self.top_p!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not SEED_MIN <= self.seed <= SEED_MAX
        ):
            raise ValueError(f"seed must be an int in [-2^63, 2^64), got {self.seed!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        self.stop_token_ids = tuple(self.stop_token_ids)
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be ints >= 0, got {list(self.stop_token_ids)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def seed_to_int64(seed: int) -> int:
    """The seed's 64-bit pattern as a signed int64 (what the rng's tensors hold)."""
    seed &= 2**64 - 1
    return seed - 2**64 if seed >= 2**63 else seed


@dataclass(slots=True)
class SamplingTensors:
    """Per-row parameters as tensors on one device: temperature [B] f32, top_k [B] i64 (0 = off),
    top_p [B] f32, seed [B] i64. `restrict`: whether any row uses top-k/top-p (host-side flag)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    restrict: bool
    all_greedy: bool = False

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], device: torch.device | str) -> SamplingTensors:
        for i, p in enumerate(params):
            if p.seed is None and not p.greedy:
                raise ValueError(f"row {i}: sampling at temperature {p.temperature} needs a seed")
        return cls(
            temperature=torch.tensor(
                [float(p.temperature) for p in params], dtype=torch.float32, device=device
            ),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([float(p.top_p) for p in params], dtype=torch.float32, device=device),
            seed=torch.tensor(
                [seed_to_int64(p.seed if p.seed is not None else 0) for p in params],
                dtype=torch.int64,
                device=device,
            ),
            restrict=any(p.top_k > 0 or p.top_p < 1.0 for p in params if not p.greedy),
            all_greedy=all(p.greedy for p in params),
        )


def apply_top_k_top_p(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Set the logits outside each row's top-k / top-p candidate set to −inf ([B, V] float32)."""
    bsz, vocab = logits.shape
    t = torch.where(temperature > 0, temperature, 1.0)[:, None]
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)[:, None]
    keep = rank < k
    probs = torch.softmax((sorted_logits / t).masked_fill(~keep, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    keep &= (mass_before < top_p[:, None]) | (rank == 0)
    keep_orig = torch.zeros_like(keep).scatter_(1, order, keep)
    return logits.masked_fill(~keep_orig, float("-inf"))


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    *,
    restrict: bool = True,
    all_greedy: bool = False,
    sampler: str = DEFAULT_SAMPLER,
) -> torch.Tensor:
    """Tokens [B] int64 for logits [B, V]. `position` [B] int64: the sequence index of the token being
    sampled (prompt length + tokens committed before it). `restrict=False` skips top-k/top-p (only valid
    when no row uses them) and `all_greedy=True` skips the noise (only valid when every temperature is 0):
    speed hints, not semantic switches. `sampler`: one of SAMPLERS (module docstring)."""
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; expected one of {', '.join(SAMPLERS)}")
    x = logits.float()
    greedy_tok = torch.argmax(x, dim=-1)  # first maximal index on every device (documented by torch)
    if all_greedy:
        return greedy_tok
    if restrict:
        x = apply_top_k_top_p(x, temperature, top_k, top_p)
    t = torch.where(temperature > 0, temperature, 1.0)[:, None]
    sampled_tok = (draw if sampler == "cdf" else draw_strided)(x / t, seed, position)
    return torch.where(temperature > 0, sampled_tok, greedy_tok)


def _gumbel_max(
    z: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, idx: torch.Tensor
) -> torch.Tensor:
    """Both samplers' stage 2: Gumbel-max (stream 0, index = the id) over each row's candidate ids `idx`
    [B, n], ascending, so argmax's first maximum is the lowest id; ids >= V (a last partial chunk) take no
    part. Returns the ids [B] int64."""
    vocab = z.shape[1]
    live = idx < vocab
    idx = torch.where(live, idx, vocab - 1)
    noise = uniform(seed[:, None], position[:, None], STREAM_SAMPLE, idx).clamp_(U_MIN, U_MAX)
    scores = torch.where(live, z.gather(1, idx), float("-inf")) - torch.log(-torch.log(noise))
    return idx.gather(1, scores.argmax(dim=-1, keepdim=True))[:, 0]


def draw(z: torch.Tensor, seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """The two-stage draw (module docstring) from z = logits / T [B, V] float32: token ids [B] int64."""
    rows, vocab = z.shape
    n = -(-vocab // SAMPLE_CHUNK)
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    w = torch.nn.functional.pad(e, (0, n * SAMPLE_CHUNK - vocab)).view(rows, n, SAMPLE_CHUNK).sum(-1)
    cum = torch.cumsum(w, dim=-1)
    u = uniform(seed, position, STREAM_CHUNK, torch.zeros_like(position))
    chosen = (cum <= (u * cum[:, -1])[:, None]).sum(-1)
    ids = torch.arange(n, device=z.device)
    last = torch.where(w > 0, ids, 0).amax(-1)
    chosen = torch.minimum(chosen, last)
    idx = chosen[:, None] * SAMPLE_CHUNK + torch.arange(SAMPLE_CHUNK, device=z.device)[None, :]
    return _gumbel_max(z, seed, position, idx)


def draw_strided(z: torch.Tensor, seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """The "strided" two-stage draw (module docstring) from z = logits / T [B, V] float32: ids [B] int64."""
    rows, vocab = z.shape
    spans, groups = -(-vocab // SAMPLE_CHUNK), SAMPLE_CHUNK // SAMPLE_GROUP
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    e = torch.nn.functional.pad(e, (0, spans * SAMPLE_CHUNK - vocab))
    w = e.view(rows, spans, groups, SAMPLE_GROUP).sum((1, 3))  # [B, groups]
    j = torch.arange(groups, device=z.device)
    u = uniform(seed[:, None], position[:, None], STREAM_GROUP, j[None, :]).clamp_(U_MIN, U_MAX)
    chosen = (torch.log(w) - torch.log(-torch.log(u))).argmax(dim=-1)  # the first maximum
    span = torch.arange(spans, device=z.device)[:, None] * SAMPLE_CHUNK
    ids = (span + torch.arange(SAMPLE_GROUP, device=z.device)[None, :]).view(1, -1)  # chunk 0's ids
    return _gumbel_max(z, seed, position, ids + chosen[:, None] * SAMPLE_GROUP)


def sample_params(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    positions: Sequence[int],
    *,
    sampler: str = DEFAULT_SAMPLER,
) -> torch.Tensor:
    """Convenience: `sample` with parameters from SamplingParams objects and positions from a list."""
    st = SamplingTensors.from_params(params, logits.device)
    pos = torch.tensor(list(positions), dtype=torch.int64, device=logits.device)
    return sample(
        logits,
        st.temperature,
        st.top_k,
        st.top_p,
        st.seed,
        pos,
        restrict=st.restrict,
        all_greedy=st.all_greedy,
        sampler=sampler,
    )
