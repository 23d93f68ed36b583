"""The demo model shapes and an HF-format writer for them (Qwen3 architecture, tied embeddings).

The folder written by `save_hf_folder` is what the embedded engine and `transformers` both load unchanged:
``config.json`` (Qwen3, with ``rope_theta`` both at the top level and in ``rope_parameters`` so old and new
readers agree), ``model.safetensors`` (fp16, HF weight names, no ``lm_head.weight`` since it is tied),
``generation_config.json`` and the tokenizer files.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(slots=True)
class LMShape:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int = 4096
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "max_position_embeddings",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    def n_params(self) -> int:
        h, i, L = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * self.head_dim
        return self.vocab_size * h + L * per_layer + h


SHAPES: dict[str, LMShape] = {
    # ~1.3M parameters (0.5M of them the tied embedding)
    "small": LMShape(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
    # ~11M parameters
    "large": LMShape(
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=64,
    ),
    # for tests: seconds on a CPU
    "tiny-small": LMShape(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
    ),
    "tiny-large": LMShape(
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=24,
        max_position_embeddings=256,
    ),
}

# ~1.9M parameters: "small" with 7 layers, a candidate nearer the large model (docs/quality.md, "What falls
# short": the divergence bound asks for a pair whose greedy tokens differ less often); not shipped
SHAPES["small-deep"] = replace(SHAPES["small"], num_hidden_layers=7)
SHAPES["tiny-small-deep"] = replace(SHAPES["tiny-small"], num_hidden_layers=2)
# ~1.9M parameters: the other way to the same size, wider (160) and one layer deeper than "small", with 5
# query heads of 32 sharing one KV head; not shipped
SHAPES["small-wide"] = replace(
    SHAPES["small"], hidden_size=160, num_hidden_layers=5, num_attention_heads=5, num_key_value_heads=1
)
SHAPES["tiny-small-wide"] = replace(SHAPES["tiny-small"], hidden_size=48, num_attention_heads=3)


def hf_config(shape: LMShape, eos_id: int, dtype: str = "float16") -> dict:
    s = asdict(shape)
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **s,
        "rope_parameters": {"rope_theta": shape.rope_theta, "rope_type": "default"},
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": shape.num_hidden_layers,
        "layer_types": ["full_attention"] * shape.num_hidden_layers,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "torch_dtype": dtype,
        "dtype": dtype,
    }


def save_hf_folder(
    state_dict: dict, shape: LMShape, tokenizer_dir: Path, out: Path, eos_id: int, meta: dict | None = None
) -> None:
    """Write a loadable HF Qwen3 folder with fp16 weights. ``state_dict`` uses HF names."""
    import torch
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: v.detach().to("cpu", torch.float16).contiguous()
        for k, v in state_dict.items()
        if k != "lm_head.weight"  # tied to model.embed_tokens.weight
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(shape, eos_id), indent=2) + "\n")
    gen = {"bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(Path(tokenizer_dir) / name, out / name)
    if meta is not None:
        (out / "training.json").write_text(json.dumps(meta, indent=2) + "\n")
