"""Build a decoder on its device in its dtype and fill its weights: from the folder's safetensors (sharded
or not; q/k/v and gate/up merged on the fly, one tensor at a time) or, for `load="dummy"`, random values
drawn straight on the device (no file needed, as SGLang's `--load-format dummy`).

Only safetensors are ever read (no pickle). Every problem names the file and the tensor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tokenrouter.runtime.engine.config import ModelConfig, ModelFolderError
from tokenrouter.runtime.engine.models.decoder import DecoderForCausalLM

# HF name piece -> (merged name piece, shard id)
STACKED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)


def build_empty(
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    make: Callable[[ModelConfig], DecoderForCausalLM] = DecoderForCausalLM,
) -> DecoderForCausalLM:
    """The model (`make(config)`: the decoder, or one rank's share of it) with parameters allocated once,
    directly on `device` in `dtype` (their values are torch's default init, to be overwritten by
    `load_weights` or `init_dummy_weights`). Not the meta device: its first use costs seconds of lazy imports."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = make(config)
    finally:
        torch.set_default_dtype(previous)
    model.post_load(device)
    model.eval().requires_grad_(False)
    return model


def _shard_slice(config: ModelConfig, merged: str, shard: str | int) -> slice:
    if merged == "qkv_proj":
        q, kv = config.q_size, config.kv_size
        return {"q": slice(0, q), "k": slice(q, q + kv), "v": slice(q + kv, q + 2 * kv)}[shard]
    size = config.intermediate_size
    return slice(shard * size, (shard + 1) * size)


def weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFolderError(f"{folder}: no *.safetensors weights in the model folder (use load='dummy')")
    return files


@torch.inference_mode()
def load_weights(model: DecoderForCausalLM, folder: Path, read_part: Callable | None = None) -> None:
    """Copy every tensor of the folder's safetensors into `model`; all parameters must be covered. `read_part(name,
    slice)`, where given, reads the part of a tensor this model holds from its safetensors slice (one rank of a
    tensor-parallel model: `tp_layers.read_shard`); q/k/v and gate/up land at the model's own offsets."""
    config = model.config
    params = dict(model.named_parameters())
    filled: dict[str, int] = {}  # param name -> rows covered (merged params are filled shard by shard)
    for file in weight_files(folder):
        _load_file(file, config, params, filled, read_part)
    _check_filled(folder, params, filled)


def _load_file(
    file: Path, config: ModelConfig, params: dict, filled: dict[str, int], read_part: Callable | None
) -> None:
    """Copy one safetensors file's tensors into `params`, counting the rows each parameter got in `filled`."""
    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except Exception as e:  # safetensors raises its own error types for a corrupt header
        raise ModelFolderError(f"{file}: cannot read safetensors ({e})") from e
    with handle as f:
        for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            if name.endswith(SKIPPED_SUFFIXES):
                continue
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue
            tensor = f.get_tensor(name) if read_part is None else read_part(name, f.get_slice(name))
            target, dest = _destination(file, name, config, params)
            if tuple(dest.shape) != tuple(tensor.shape):
                raise ModelFolderError(
                    f"{file}: tensor {name!r} has shape {tuple(tensor.shape)}, the config needs "
                    f"{tuple(dest.shape)}"
                )
            dest.copy_(tensor)
            filled[target] = filled.get(target, 0) + dest.shape[0]


def _destination(file: Path, name: str, config: ModelConfig, params: dict) -> tuple[str, torch.Tensor]:
    """(model parameter, the rows of it) a checkpoint tensor fills: q/k/v and gate/up at their offsets in
    the merged parameter."""
    target, rows = name, None
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in STACKED:
        merged, shard = STACKED[parts[-2]]
        target = ".".join(parts[:-2] + [merged, parts[-1]])
        rows = _shard_slice(config, merged, shard)
    param = params.get(target)
    if param is None:
        raise ModelFolderError(f"{file}: unexpected tensor {name!r} for a {config.architecture}")
    return target, (param.data if rows is None else param.data[rows])


def _check_filled(folder: Path, params: dict, filled: dict[str, int]) -> None:
    """ModelFolderError naming the parameters the checkpoint did not cover."""
    missing = [n for n, p in params.items() if filled.get(n, 0) != p.shape[0]]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelFolderError(f"{folder}: weights missing from the safetensors: {shown}")


@torch.inference_mode()
def init_dummy_weights(model: DecoderForCausalLM, seed: int = 0, std: float = 0.02) -> None:
    """Random weights on the model's own device: N(0, std) for matrices, 1 for norms, 0 for biases."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            p.normal_(0.0, std, generator=gen)


def random_hf_state_dict(config: ModelConfig, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """A random checkpoint in HF layout (separate q/k/v, gate/up), float32 on CPU, for `make-model`.
    Norm weights are drawn around 1 and biases around 0 so that tests exercise them."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = std) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    h = config.hidden_size
    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rand(config.vocab_size, h, scale=0.25)}
    for layer in range(config.num_hidden_layers):
        sd.update(_random_layer(config, f"model.layers.{layer}.", rand))
    sd["model.norm.weight"] = 1.0 + rand(h, scale=0.1)
    if not config.tie_word_embeddings:
        sd["lm_head.weight"] = rand(config.vocab_size, h, scale=2 * h**-0.5)
    return sd


def _random_layer(config: ModelConfig, pre: str, rand: Callable) -> dict[str, torch.Tensor]:
    """One decoder layer's random tensors in HF layout, drawn in the checkpoint's order."""
    h, i = config.hidden_size, config.intermediate_size
    sd = {pre + "input_layernorm.weight": 1.0 + rand(h, scale=0.1)}
    sd[pre + "post_attention_layernorm.weight"] = 1.0 + rand(h, scale=0.1)
    for proj, out in (("q_proj", config.q_size), ("k_proj", config.kv_size), ("v_proj", config.kv_size)):
        sd[pre + f"self_attn.{proj}.weight"] = rand(out, h, scale=h**-0.5)
        if config.qkv_bias:
            sd[pre + f"self_attn.{proj}.bias"] = rand(out, scale=0.1)
    sd[pre + "self_attn.o_proj.weight"] = rand(h, config.q_size, scale=config.q_size**-0.5)
    if config.o_bias:
        sd[pre + "self_attn.o_proj.bias"] = rand(h, scale=0.1)
    if config.qk_norm:
        sd[pre + "self_attn.q_norm.weight"] = 1.0 + rand(config.head_dim, scale=0.1)
        sd[pre + "self_attn.k_norm.weight"] = 1.0 + rand(config.head_dim, scale=0.1)
    sd[pre + "mlp.gate_proj.weight"] = rand(i, h, scale=h**-0.5)
    sd[pre + "mlp.up_proj.weight"] = rand(i, h, scale=h**-0.5)
    sd[pre + "mlp.down_proj.weight"] = rand(h, i, scale=i**-0.5)
    return sd


def save_safetensors(sd: dict[str, torch.Tensor], path: Path, dtype: torch.dtype = torch.float32) -> None:
    save_file({k: v.to(dtype).contiguous() for k, v in sd.items()}, str(path), metadata={"format": "pt"})
