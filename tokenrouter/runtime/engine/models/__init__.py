"""Model implementations of the embedded engine (the Qwen3 / Qwen2 / Llama decoder) and their loader."""

from tokenrouter.runtime.engine.models.decoder import DecoderForCausalLM
from tokenrouter.runtime.engine.models.loader import build_empty, init_dummy_weights, load_weights

__all__ = ["DecoderForCausalLM", "build_empty", "init_dummy_weights", "load_weights"]
