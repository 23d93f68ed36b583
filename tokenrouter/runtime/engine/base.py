"""The `Engine` seam: everything a subserver needs from model execution, and nothing else.

A subserver's scheduler decides *which* requests run in a step; an engine runs them. The engine owns the
model weights, the paged KV pool and the per-request token history; the scheduler owns queues, routing and
the request lifecycle. Implementations: the embedded PyTorch engine (default) and, where installed, SGLang.

Request lifecycle, seen from the engine (rid = the request id, a str):
- `forward([StepInput(rid, new_tokens)])` with an rid the engine has not seen: prefill `new_tokens`.
- the same rid again: extend by `new_tokens` (one token = a decode; several = an extend, e.g. the tokens
  a peer model wrote while the request was away). Between two calls the request is *held*: its KV stays.
- `release(rid)`: free everything the request holds. Releasing an unknown rid is a no-op.
- Under memory pressure the engine may evict held requests (least recently used first) at any time; the
  next `forward` of an evicted rid transparently re-prefills its whole history. Callers never see this,
  except in `stats()`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class ModelInfo:
    """What the rest of the system may know about a loaded model."""

    name: str
    vocab_size: int  # width of a logits row
    hidden_size: int
    max_len: int  # longest sequence (prompt + generated) the engine accepts
    eos_token_ids: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    # of StepOutput.logits: the model's dtype (embedded), float32 (SGLang, whose logits processor casts them)
    logits_dtype: torch.dtype
    scores_prompts: bool = False  # computes StepInput.prompt_logprobs (the embedded engine on one device)


@dataclass(slots=True)
class StepInput:
    rid: str
    new_token_ids: Sequence[int]  # at least one token
    # ≥ 0 (an engine whose info.scores_prompts): also score the row, on its first step only (the whole
    # sequence is computed, no cached prefix): StepOutput.prompt_logprobs
    prompt_logprobs: int = -1


@dataclass(slots=True)
class StepOutput:
    """Per input row, in the order given: last-position logits and (if asked) last-layer hidden state.
    The tensors belong to the caller: later steps never overwrite them."""

    logits: torch.Tensor  # [B, vocab_size], ModelInfo.logits_dtype, on the engine's device
    hidden: torch.Tensor | None = None  # [B, hidden_size] (after the final norm), when want_hidden
    stats: dict = field(default_factory=dict)  # e.g. {"mode": "decode", "tokens": 8, "evicted": 0}
    # rid -> per token after the first of a row with prompt_logprobs = k ≥ 0: [its log-probability given the
    # tokens before it, [[id, log-probability], ...] of the k most likely at its position] (`scoring.py`)
    prompt_logprobs: dict[str, list] = field(default_factory=dict)


class EngineError(RuntimeError):
    """A request the engine cannot run (too long for max_len, pool too small). The message is for users."""


class Engine(ABC):
    info: ModelInfo

    @abstractmethod
    def forward(self, batch: Sequence[StepInput], want_hidden: bool = False) -> StepOutput:
        """Run one ragged step (prefill, extend and decode rows mixed). Raises EngineError for a row that
        can never fit; the caller fails that request and retries the rest."""

    @abstractmethod
    def release(self, rid: str) -> None:
        """Free the request's KV and history. Idempotent."""

    @abstractmethod
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Input-embedding rows [B, hidden_size] for token ids [B] (for routers that read embedding())."""

    @abstractmethod
    def seq_len(self, rid: str) -> int:
        """Tokens the engine has seen for rid (0 if unknown)."""

    @abstractmethod
    def stats(self) -> dict:
        """Pool accounting: {"pages_total", "pages_free", "held", "evictions", ...}."""

    def kv_room(self) -> tuple[int, int] | None:
        """(free KV token slots, free request rows) now, or None where the engine does not say: the scheduler
        then leaves each step's rows to the engine, which evicts held requests to fit them."""
        return None

    def resident(self, rid: str) -> bool:
        """Whether rid's KV is in the pool now, so that a step of it runs its new tokens only (a request not
        seen, or evicted, runs its whole history)."""
        return True

    def late_shared_prefills(self, arrivals: Sequence[tuple[str, Sequence[int]]]) -> set[str]:
        """Of the sequences arriving in one step without KV here (rid, all its tokens), those that would prefill
        the same uncached prefix as an earlier one: they wait for the next step and match its KV there. Only an
        engine with a prefix cache says any."""
        return set()
