"""The Qwen3 / Qwen2 / Llama decoder (one implementation; the families differ only in config flags:
Qwen2 has q/k/v biases, Qwen3 has per-head RMSNorm on q and k, Llama may have llama3 rope scaling).

Parameter names follow the HF checkpoints, except that q/k/v are merged into `qkv_proj` and gate/up into
`gate_up_proj` at load time (`models/loader.py`), so each step launches two GEMMs fewer per layer.

`forward(forward_batch)` is the paged, batched path (capturable for fixed shapes; attention through the
backend set in `attn_backend`); `forward_full(token_ids)` is a teacher-forced pass over one sequence with
plain causal attention and no KV cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenrouter.runtime.engine.attention.base import AttentionBackend
from tokenrouter.runtime.engine.compile_ahead import layers_to_build
from tokenrouter.runtime.engine.config import ModelConfig
from tokenrouter.runtime.engine.forward_batch import ForwardBatch
from tokenrouter.runtime.engine.models.layers import RMSNorm, RotaryEmbedding, silu_and_mul


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.scaling = config.scaling
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.rotary = rotary

    def _qkv(self, positions: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        return q, k, v

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, fb: ForwardBatch, backend: AttentionBackend
    ) -> torch.Tensor:
        q, k, v = self._qkv(positions, x)
        out = backend.forward(q, k, v, self.layer_id, fb)
        return self.o_proj(out.reshape(-1, self.q_size))

    def forward_full(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(positions, x)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            is_causal=True,
            scale=self.scaling,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return self.o_proj(out.transpose(0, 1).reshape(-1, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_id, rotary)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
        )
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, self.rotary) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DecoderForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.attn_backend: AttentionBackend | None = None

    def post_load(self, device: torch.device) -> None:
        """Build what is not a parameter (the rotary table) on the model's device."""
        self.model.rotary.build(device)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight)

    def forward(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """One paged step: last-position logits [B, V] and final-norm hidden states [B, H]."""
        backend = self.attn_backend
        if getattr(backend, "fused_ops", False):  # the Triton path: same math, fused element-wise ops
            return backend.fused_forward(self, fb)
        positions = fb.positions
        h = self.model.embed_tokens(fb.input_ids)
        for layer in layers_to_build(self.model.layers):  # all of them, but in a build-only block
            h = h + layer.self_attn(positions, layer.input_layernorm(h), fb, backend)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        last = self.model.norm(h[fb.last_indices])
        return self.logits(last), last

    @torch.inference_mode()
    def forward_full(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced pass over one sequence, no KV cache: logits [T, V] and hidden [T, H] at every
        position (hidden after the final norm)."""
        device = self.model.embed_tokens.weight.device
        ids = torch.as_tensor(token_ids, dtype=torch.int64, device=device).flatten()
        if ids.numel() > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {ids.numel()} tokens exceeds max_position_embeddings "
                f"({self.config.max_position_embeddings})"
            )
        positions = torch.arange(ids.numel(), device=device)
        h = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = h + layer.self_attn.forward_full(positions, layer.input_layernorm(h))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = self.model.norm(h)
        return self.logits(h), h
