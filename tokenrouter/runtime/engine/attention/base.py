"""The `AttentionBackend` interface: paged attention over the token-to-KV pool.

One backend instance serves every layer of one model. Its life per step:

1. `init_forward_metadata(forward_batch)` — runs on the host, OUTSIDE any CUDA graph, once per step before
   the model forward. May read the host copies in the batch (`seq_lens_cpu`, `max_seq_len`, ...) and
   launch device work; stores what `forward` needs in `forward_batch.attn_metadata` (or on the backend, for
   backends whose graph runner keeps static buffers).
2. `forward(q, k, v, layer_id, forward_batch)` — runs INSIDE the model forward (capturable): no `.item()`,
   no `.tolist()`, no host syncs, no allocation whose shape depends on tensor values. It
   - writes this step's new `k`, `v` into `forward_batch.token_to_kv_pool` at `forward_batch.out_cache_loc`
     (layer `layer_id`), then
   - computes, for every new token of row i at position p, causal attention over the row's KV slots
     `req_to_token[req_pool_indices[i], 0 : p + 1]` (its prefix in the cache plus its new tokens up to itself).

Shapes: `q` [T, num_heads, head_dim], `k`/`v` [T, num_kv_heads, head_dim] (already normed and rotated),
all in the model dtype; returns [T, num_heads, head_dim]. GQA: query head h reads KV head
h // (num_heads // num_kv_heads). Scale: `scaling` (head_dim ** -0.5 for the supported families).

Backends: `sdpa.py` (gather + torch SDPA; correct on any device; the reference), and on GPU a Triton backend
(`attention/triton_backend.py`, class `TritonAttnBackend`, same constructor) that may add the graph hooks
`init_forward_metadata_capture_cuda_graph` / `init_forward_metadata_replay_cuda_graph` used by
`cuda_graph_runner.py`. `create_attention_backend` in `attention/__init__.py` picks one by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from tokenrouter.runtime.engine.config import EngineTuning
from tokenrouter.runtime.engine.forward_batch import ForwardBatch


@dataclass(slots=True)
class AttentionConfig:
    """What a backend knows about the model's attention (the same for every layer)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    num_layers: int
    dtype: torch.dtype
    device: torch.device
    hidden_size: int | None = None  # the model's (for backends whose kernels are tuned per layer shape)
    tuning: EngineTuning = field(default_factory=EngineTuning)  # the Triton backend's (others ignore it)

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.num_kv_heads < 1 or self.head_dim < 1:
            raise ValueError("attention heads and head_dim must be positive")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )


class AttentionBackend(ABC):
    name: str = "base"

    def __init__(self, config: AttentionConfig) -> None:
        self.config = config

    @abstractmethod
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Prepare per-step metadata (outside the graph). See the module docstring."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """Save k/v to the pool at out_cache_loc, then paged causal attention. Returns [T, heads, head_dim]."""
