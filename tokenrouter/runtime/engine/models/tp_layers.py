"""The decoder sharded over the ranks of a tensor-parallel group (Megatron's layout, as SGLang and vLLM use it).

Per layer: the merged q/k/v projection and the merged gate/up projection are column-parallel (each rank holds
num_attention_heads/tp query heads, num_key_value_heads/tp KV heads and intermediate_size/tp of the MLP), so
attention and SwiGLU run on the rank's own heads and columns with no communication; the output projection and
the down projection are row-parallel: each rank multiplies its slice of the inputs and one all-reduce sums the
partial results (the bias, where there is one, is added once, after the sum). The embedding and the LM head are
vocabulary-parallel: each rank holds ceil(vocab/tp) rows (the last rank's tail is zero padding); a token's
embedding is the all-reduce of the rank that holds its row (the others contribute zeros), and the logits are the
all-gather of every rank's slice, the padding cut off, so every rank ends a step with the full logits [B, V] and
the full final hidden state [B, H], bit for bit the same on every rank.

`TPDecoderForCausalLM(config, group)` is built on the rank's device like the plain decoder (`loader.build_empty`);
`read_shard(name, sl, group, config)` is the loader's hook that reads one rank's slice of a checkpoint tensor
(`safe_open(...).get_slice`), so a rank never reads the other ranks' weights. `shard_config(config, tp)` is the
per-rank shape, and the place a tp that does not divide the model is refused.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from tokenrouter.runtime.engine.config import ModelConfig, ModelFolderError
from tokenrouter.runtime.engine.models.decoder import DecoderForCausalLM

if TYPE_CHECKING:
    from tokenrouter.runtime.engine.parallel import TPGroup

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # split along the output features (rows)
ROW = ("o_proj", "down_proj")  # split along the input features (columns)
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def shard_config(config: ModelConfig, tp: int) -> ModelConfig:
    """The shape one of `tp` ranks holds; ModelFolderError naming the model and the number that does not divide."""
    if tp < 1:
        raise ValueError(f"tensor parallelism needs at least one rank, got {tp}")
    for field in ("num_key_value_heads", "num_attention_heads", "intermediate_size"):
        value = getattr(config, field)
        if value % tp:
            raise ModelFolderError(
                f"{config.path or 'the model'}: {field} ({value}) is not divisible by the {tp} GPUs of its "
                f"`gpus:` (tensor parallelism splits it evenly; choose a number of GPUs that divides it)"
            )
    return dataclasses.replace(
        config,
        num_attention_heads=config.num_attention_heads // tp,
        num_key_value_heads=config.num_key_value_heads // tp,
        intermediate_size=config.intermediate_size // tp,
        vocab_size=-(-config.vocab_size // tp),
    )


class RowParallelLinear(nn.Linear):
    """y = all_reduce(x_rank @ W_rank^T) + b: the rank holds W's columns for its slice of x."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group: TPGroup) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.group.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """The embedding rows [rank * rows, (rank + 1) * rows) of the vocabulary; a lookup is an all-reduce."""

    def __init__(self, rows: int, hidden: int, group: TPGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.rows = rows
        self.start = group.rank * rows
        self.group = group

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        local = token_ids - self.start
        mine = (local >= 0) & (local < self.rows)
        out = F.embedding(torch.where(mine, local, 0), self.weight)
        out = out.masked_fill(~mine[..., None], 0)
        return self.group.all_reduce(out)


class TPDecoderForCausalLM(DecoderForCausalLM):
    """The decoder of `config` (the whole model's) as one rank of `group` holds it (see the module docstring).
    `self.config` is the rank's shape (`shard_config`): the KV pool and the attention read their head counts
    from it; `self.full_config` is the model's."""

    def __init__(self, config: ModelConfig, group: TPGroup) -> None:
        local = shard_config(config, group.size)
        super().__init__(local)
        self.full_config = config
        self.group = group
        h = config.hidden_size
        for layer in self.model.layers:
            layer.self_attn.o_proj = RowParallelLinear(local.q_size, h, config.o_bias, group)
            layer.mlp.down_proj = RowParallelLinear(local.intermediate_size, h, False, group)
        self.model.embed_tokens = VocabParallelEmbedding(local.vocab_size, h, group)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The full logits [.., V]: every rank's vocabulary slice, gathered."""
        local = super().logits(hidden)
        return self.group.all_gather_last(local)[..., : self.full_config.vocab_size]


def read_shard(name: str, sl, group: TPGroup, config: ModelConfig) -> torch.Tensor:
    """Rank `group.rank`'s part of checkpoint tensor `name` (HF layout), read through its safetensors slice
    `sl`: rows of the column-parallel projections, columns of the row-parallel ones' weights, rows of the
    vocabulary (zero-padded to the rank's row count), the whole of everything else."""
    rank, size = group.rank, group.size
    parts = name.split(".")
    kind = parts[-2] if len(parts) >= 2 else ""
    shape = sl.get_shape()
    if kind in COLUMN:
        n = shape[0] // size
        return sl[rank * n : (rank + 1) * n]
    if kind in ROW and parts[-1] == "weight" and len(shape) == 2:
        n = shape[1] // size
        return sl[:, rank * n : (rank + 1) * n]
    if name in VOCAB and len(shape) == 2:
        rows = -(-config.vocab_size // size)
        start, stop = rank * rows, min((rank + 1) * rows, shape[0])
        part = sl[start:stop] if start < stop else torch.empty(0, shape[1])
        if part.shape[0] < rows:  # the last rank's padding rows: never looked up, their logits cut off
            part = torch.cat([part, part.new_zeros(rows - part.shape[0], shape[1])])
        return part
    return sl[:]
