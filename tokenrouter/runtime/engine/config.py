"""Model configuration read from a local HF-format folder (config.json), for the Qwen3, Qwen2 and Llama
decoder families (Mistral's `MistralForCausalLM` is the Llama decoder without a sliding window: Mistral 7B v0.3,
Mistral Nemo; a config with a sliding window, as Mistral 7B v0.1's, is refused). Every problem with the folder
raises `ModelFolderError` (an `EngineError`) whose message names the path and what is wrong."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tokenrouter.runtime.engine.base import EngineError

# architecture name in config.json -> family
ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
}
MODEL_TYPES = {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama", "mistral": "llama"}


class ModelFolderError(EngineError):
    """A model folder that is missing, incomplete or malformed."""


@dataclass(slots=True)
class RopeScaling:
    """Llama-3 style frequency scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(slots=True)
class ModelConfig:
    family: str  # "qwen3" | "qwen2" | "llama"
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None
    path: str = ""

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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive")
        if self.family not in ("qwen3", "qwen2", "llama"):
            raise ValueError(f"unsupported model family {self.family!r}")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def scaling(self) -> float:
        return self.head_dim**-0.5

    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        layer = attn + 3 * h * i + 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return v * h * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * layer + h

    @classmethod
    def from_dict(cls, raw: dict, path: str = "") -> ModelConfig:
        where = path or "config"
        family, arch = _family(raw, where)
        _check_required(raw, where)
        rope_theta, scaling = _rope(raw, where)
        _check_supported(raw, family, where)
        bias = bool(raw.get("attention_bias", False))
        try:
            return cls(
                family=family,
                architecture=arch or family,
                **_sizes(raw),
                rope_theta=float(rope_theta),
                rope_scaling=scaling,
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=True if family == "qwen2" else bias,
                o_bias=False if family == "qwen2" else bias,
                qk_norm=family == "qwen3",
                eos_token_ids=_eos_ids(raw),
                torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
                path=path,
            )
        except (ValueError, TypeError) as e:
            raise ModelFolderError(f"{where}: {e}") from e


_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def _check_required(raw: dict, where: str) -> None:
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ModelFolderError(f"{where}: missing field(s) {', '.join(missing)}")


def _eos_ids(raw: dict) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return tuple(int(e) for e in eos_ids)


def _family(raw: dict, where: str) -> tuple[str, str | None]:
    """(model family, architecture name) of a config.json, or ModelFolderError for an unsupported one."""
    arch_list = raw.get("architectures") or []
    arch = arch_list[0] if isinstance(arch_list, list) and arch_list else None
    family = ARCHITECTURES.get(arch) if arch else MODEL_TYPES.get(raw.get("model_type", ""))
    if family is None:
        supported = ", ".join(sorted(ARCHITECTURES))
        got = arch or raw.get("model_type") or "nothing"
        raise ModelFolderError(f"{where}: unsupported architecture {got!r} (supported: {supported})")
    return family, arch


def _rope(raw: dict, where: str) -> tuple[object, RopeScaling | None]:
    """(rope theta as given, llama3 scaling or None) of a config.json."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ModelFolderError(f"{where}: rope_parameters/rope_scaling must be an object")
    rope_theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "llama3":
        try:
            return rope_theta, RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFolderError(f"{where}: incomplete llama3 rope scaling ({e})") from e
    if rope_type not in ("default", None):
        raise ModelFolderError(f"{where}: unsupported rope type {rope_type!r} (supported: default, llama3)")
    return rope_theta, None


def _check_supported(raw: dict, family: str, where: str) -> None:
    """ModelFolderError for the features the engine does not implement."""
    if raw.get("mlp_bias"):
        raise ModelFolderError(f"{where}: mlp_bias is not supported")
    if raw.get("use_sliding_window") or (family == "llama" and raw.get("sliding_window")):
        raise ModelFolderError(f"{where}: sliding-window attention is not supported")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ModelFolderError(f"{where}: unsupported hidden_act {act!r} (only silu)")


def _sizes(raw: dict) -> dict:
    """The model's sizes (ModelConfig fields) from a config.json holding the `_REQUIRED` fields."""
    heads = raw["num_attention_heads"]
    return dict(
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        vocab_size=raw["vocab_size"],
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
    )


def read_json(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as e:
        raise ModelFolderError(f"{path}: cannot read ({e.strerror})") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelFolderError(f"{path}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}") from e
    if not isinstance(data, dict):
        raise ModelFolderError(f"{path}: expected a JSON object")
    return data


def check_model_folder(path: str | Path, *, need_weights: bool = True) -> Path:
    """The folder as a Path, or ModelFolderError naming what is missing."""
    folder = Path(path)
    if not folder.exists():
        raise ModelFolderError(f"{folder}: model folder does not exist")
    if not folder.is_dir():
        raise ModelFolderError(f"{folder}: not a directory (a model is a folder with config.json)")
    if not (folder / "config.json").is_file():
        raise ModelFolderError(f"{folder}: no config.json in the model folder")
    if need_weights and not any(folder.glob("*.safetensors")):
        raise ModelFolderError(
            f"{folder}: no *.safetensors weights in the model folder (use load='dummy' for random weights)"
        )
    return folder


def load_model_config(path: str | Path) -> ModelConfig:
    """Read and validate config.json (eos ids from generation_config.json when it has them)."""
    folder = check_model_folder(path, need_weights=False)
    raw = read_json(folder / "config.json")
    config = ModelConfig.from_dict(raw, str(folder / "config.json"))
    config.path = str(folder)
    gen = folder / "generation_config.json"
    if gen.is_file():
        eos = read_json(gen).get("eos_token_id")
        if isinstance(eos, int):
            config.eos_token_ids = (eos,)
        elif isinstance(eos, list) and all(isinstance(e, int) for e in eos):
            config.eos_token_ids = tuple(eos)
    if config.rope_scaling is not None and not math.isfinite(config.rope_scaling.factor):
        raise ModelFolderError(f"{folder}: rope scaling factor must be finite")
    return config


@dataclass(slots=True)
class EngineTuning:
    """The GPU fast path's tuning (the Triton attention backend reads it; other backends ignore it). Every
    default is what the product runs; a field names the step sizes a kernel takes, which are per GPU and model.

    - `gemv_rows_batch_max`, `gemv_rows_max`: steps of 2 to `gemv_rows_max` tokens of at most
      `gemv_rows_batch_max` requests run the few-row GEMV (`gemv_rows`, at most 8 rows).
    - `dot_rows_max`, `dot_rows_decode_max`: the other steps of up to `dot_rows_max` tokens (decodes: up to
      `dot_rows_decode_max` rows) run the tensor-core few-row kernel `dot_rows` (at most 32 rows); None: 32
      where the tuned tile tables hold 32-row tiles for the GPU, else 16.
    - `fused_merge_rows`, `fused_merge_passes`: attention row blocks of up to `fused_merge_rows` rows merge
      their KV splits in the attention kernel, and so do larger blocks whose partials it loads in at most
      `fused_merge_passes` passes (0: none); the others merge in a second kernel.
    - `attn_split_rows`: attention launches of up to this many query rows (the longest extend's tokens x
      the GQA group) may split their KV range over programs.
    - `tuned_tiles`: `dot_rows` and the GEMVs take the tile configs measured fastest inside the CUDA graph
      step where a table holds one for the GPU model (the shipped `tuned_tiles.json`, then
      `tuned_tiles_files`, a later file's entries over an earlier one's); off: the autotuner's choice (`bench/graph_tune.py` tunes so).
    - `pdl`: programmatic dependent launch between the Triton kernels on sm_90+ (off: plain launches, for a
      GPU stack whose graph capture fails with it).
    """

    gemv_rows_batch_max: int = 2
    gemv_rows_max: int = 2
    dot_rows_max: int | None = None
    dot_rows_decode_max: int = 16
    fused_merge_rows: int = 4
    fused_merge_passes: int = 1
    attn_split_rows: int = 256
    tuned_tiles: bool = True
    tuned_tiles_files: tuple[str, ...] = ()
    pdl: bool = True

    # field -> (least, most) of the integer fields
    LIMITS = {
        "gemv_rows_batch_max": (0, 1 << 16),
        "gemv_rows_max": (2, 8),
        "dot_rows_max": (2, 32),
        "dot_rows_decode_max": (2, 32),
        "fused_merge_rows": (1, 64),
        "fused_merge_passes": (0, 16),
        "attn_split_rows": (64, 65536),
    }

    def __post_init__(self) -> None:
        for name, (least, most) in self.LIMITS.items():
            value = getattr(self, name)
            if value is None and name == "dot_rows_max":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
                raise ValueError(f"tuning.{name} must be an int from {least} to {most}, got {value!r}")
        for name in ("tuned_tiles", "pdl"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"tuning.{name} must be true or false, got {getattr(self, name)!r}")
        files = self.tuned_tiles_files
        if isinstance(files, str) or not all(isinstance(f, str) and f.strip() for f in files):
            raise ValueError(f"tuning.tuned_tiles_files must be a list of file paths, got {files!r}")
        self.tuned_tiles_files = tuple(files)
