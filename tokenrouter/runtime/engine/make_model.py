"""`tokenrouter make-model`: write a random-weight HF-format model folder.

A folder holds config.json, generation_config.json, a small byte-level BPE tokenizer (trained
deterministically on a built-in text; tokenizer.json + tokenizer_config.json with a chat template) and,
for small shapes, random weights as model.safetensors. Large shapes (qwen3-0.6b/1.7b/8b/32b) get config and
tokenizer only, with the real vocabulary size in config.json (the tokenizer's own vocabulary is smaller);
the engine's `load="dummy"` then fills random weights straight on the device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenrouter.runtime.engine.config import ModelConfig

ARCH_NAMES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOKENIZER_VOCAB = 512
MAX_WEIGHT_PARAMS = 50_000_000  # above this a shape gets no weights file (use load="dummy")

SHAPES: dict[str, dict] = {
    # hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, tied
    "tiny": dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=512, tie=True),
    "qwen3-0.6b": dict(hidden=1024, intermediate=3072, layers=28, heads=16, kv_heads=8, head_dim=128, vocab=151936, tie=True),
    "qwen3-1.7b": dict(hidden=2048, intermediate=6144, layers=28, heads=16, kv_heads=8, head_dim=128, vocab=151936, tie=True),
    "qwen3-8b": dict(hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, head_dim=128, vocab=151936, tie=False),
    "qwen3-32b": dict(hidden=5120, intermediate=25600, layers=64, heads=64, kv_heads=8, head_dim=128, vocab=151936, tie=False),
}  # fmt: skip

# the two committed example models (examples/models/NAME): make-model arguments and seed; regenerate with
#   tokenrouter make-model examples/models/tiny-small --shape tiny --seed 0 --force
#   tokenrouter make-model examples/models/tiny-large --shape tiny --hidden 128 --intermediate 256 \
#       --layers 4 --heads 8 --kv-heads 4 --seed 1 --force
EXAMPLE_MODELS: dict[str, tuple[dict, int]] = {
    "tiny-small": ({}, 0),
    "tiny-large": ({"hidden": 128, "intermediate": 256, "layers": 4, "heads": 8, "kv_heads": 4}, 1),
}

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TRAINING_TEXT = """\
The small model writes most of the tokens, and the large model writes the hard ones. A router looks at
every step and decides where the next token should come from. When the small model is sure of itself, it
keeps going; when it hesitates, the request hops to the large model, which writes one token or a few, and
then hands the request back. Nothing is recomputed: each model keeps the cache of the tokens it has seen,
and only the new tokens travel between them.
Hello! How are you today? I am fine, thank you. What is two plus two? Two plus two is four.
Write a short poem about the sea. The sea is wide, the sea is deep, it sings the sailors off to sleep.
def add(a, b):
    return a + b
for i in range(10):
    print(i, add(i, i))
The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 10 100 1000.
Question: what is the capital of France? Answer: Paris. Question: what colour is the sky? Answer: blue.
{"role": "user", "content": "Explain token routing in one sentence."}
"""


@dataclass(slots=True)
class ModelShape:
    arch: str = "qwen3"
    hidden: int = 64
    intermediate: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    vocab: int = 512
    tie: bool = True
    max_position_embeddings: int = 4096
    rope_theta: float = 1_000_000.0

    def __post_init__(self) -> None:
        if self.arch not in ARCH_NAMES:
            raise ValueError(f"unknown arch {self.arch!r}; choose one of {', '.join(ARCH_NAMES)}")
        for name in ("hidden", "intermediate", "layers", "heads", "kv_heads", "head_dim", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even, got {self.head_dim}")
        if self.vocab < TOKENIZER_VOCAB:
            raise ValueError(f"vocab must be >= {TOKENIZER_VOCAB} (the tokenizer's size)")


def shape_for(name: str, **overrides) -> ModelShape:
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose one of {', '.join(SHAPES)}")
    fields = dict(SHAPES[name])
    if name != "tiny":
        fields["max_position_embeddings"] = 40960
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return ModelShape(**fields)


def config_dict(shape: ModelShape) -> dict:
    cfg = {
        "architectures": [ARCH_NAMES[shape.arch]],
        "model_type": shape.arch,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": shape.rope_theta,
        "max_position_embeddings": shape.max_position_embeddings,
        "tie_word_embeddings": shape.tie,
        "attention_bias": shape.arch == "qwen2",
        "bos_token_id": None,
        "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>"),
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }
    if shape.arch == "llama":
        cfg["mlp_bias"] = False
    return cfg


def train_tokenizer():
    """A byte-level BPE of TOKENIZER_VOCAB entries; the same text and settings give the same merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT.splitlines(keepends=True), trainer)
    return tok


def write_tokenizer(out: Path) -> None:
    train_tokenizer().save(str(out / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 131072,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")


def make_model(
    out_dir: str | Path,
    shape: ModelShape,
    *,
    seed: int = 0,
    weights: bool | None = None,
    force: bool = False,
) -> Path:
    """Write the folder. `weights=None`: write model.safetensors (float32) when the shape has at most
    MAX_WEIGHT_PARAMS parameters. Raises ValueError for an existing non-empty folder (unless force)."""
    import torch

    from tokenrouter.runtime.engine.models.loader import random_hf_state_dict, save_safetensors

    out = Path(out_dir)
    _check_out_dir(out, force)
    raw = config_dict(shape)
    config = ModelConfig.from_dict(raw, str(out / "config.json"))
    weights = _want_weights(config, weights)
    raw["torch_dtype"] = "float32" if weights else "bfloat16"  # the dtype of the weights file, if any
    _write_folder(out, raw)
    if weights:
        save_safetensors(random_hf_state_dict(config, seed), out / "model.safetensors", torch.float32)
    return out


def _check_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not force:
        raise ValueError(f"{out}: directory is not empty (pass --force to overwrite)")


def _want_weights(config: ModelConfig, weights: bool | None) -> bool:
    """Whether to write a weights file: by default for shapes of at most MAX_WEIGHT_PARAMS parameters;
    ValueError when asked for a larger one."""
    if weights is None:
        return config.num_params() <= MAX_WEIGHT_PARAMS
    if weights and config.num_params() > MAX_WEIGHT_PARAMS:
        raise ValueError(
            f"a {config.num_params() / 1e9:.2f}B-parameter shape gets no weights file; "
            "load it with the engine's dummy load"
        )
    return weights


def _write_folder(out: Path, raw: dict) -> None:
    """The folder without weights (an older weights file removed): config.json, generation_config.json and
    the tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.safetensors"):
        stale.unlink()
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    gen = {"eos_token_id": [SPECIAL_TOKENS.index("<|im_end|>"), SPECIAL_TOKENS.index("<|endoftext|>")],
           "pad_token_id": 0, "do_sample": True, "temperature": 0.7, "top_p": 0.9}  # fmt: skip
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    write_tokenizer(out)
