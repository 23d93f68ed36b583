"""Attention backends over the paged KV pool; see `base.py` for the interface."""

from __future__ import annotations

from tokenrouter.runtime.engine.attention.base import AttentionBackend, AttentionConfig
from tokenrouter.runtime.engine.attention.sdpa import SdpaAttnBackend

BACKENDS = ("auto", "sdpa", "triton")


def create_attention_backend(name: str, config: AttentionConfig) -> AttentionBackend:
    """`auto`: the Triton backend on CUDA when it is importable, else SDPA. `sdpa`, `triton`: that one."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "sdpa" or (name == "auto" and config.device.type != "cuda"):
        return SdpaAttnBackend(config)
    try:
        from tokenrouter.runtime.engine.attention.triton_backend import TritonAttnBackend
    except ImportError as e:
        if name == "auto":
            return SdpaAttnBackend(config)
        raise ValueError(f"the triton attention backend is not available: {e}") from e
    if config.device.type != "cuda":
        raise ValueError("the triton attention backend needs a CUDA device")
    return TritonAttnBackend(config)


__all__ = ["AttentionBackend", "AttentionConfig", "SdpaAttnBackend", "create_attention_backend"]
