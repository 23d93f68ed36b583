"""What the Triton kernels share: programmatic dependent launch (`_pdl`), the autotuner (`_autotune`), and the
host-side integer helpers of their launches (`cdiv`, `next_pow2`)."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


# Programmatic dependent launch (PDL, sm_90+): a kernel launched with it may start while the kernel before
# it in the stream is still running. Each kernel here that takes USE_PDL waits (`gdc_wait`) for the kernel
# before it to finish, and for its writes to be visible, before it reads anything a kernel wrote or writes
# anything, and then lets the next kernel start (`gdc_launch_dependents`); the GEMV issues its first weight
# tile before waiting (weights are never written), so that read overlaps the previous kernel's tail. Every
# program of a PDL kernel waits before it ends, so a kernel's end still implies the end of all before it.
# In a CUDA graph the launches become programmatic edges. Not under the interpreter (CPU).
def _pdl_supported() -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        return "launch_pdl" in CUDAOptions.__dataclass_fields__ and hasattr(tl.extra.cuda, "gdc_wait")
    except Exception:  # another backend, or a Triton without it
        return False


PDL_SUPPORTED = _pdl_supported()


# Autotuning results on disk. Each autotuned kernel (the linear layers) times every candidate tile config per
# (N, K, variant) the first time a process runs it: on the H200 that is most of an engine's start once
# Triton's compiled kernels are cached (the 0.6B's start: 26.8 s tuning again, 9.4 s with the results cached). With
# the results cached, Triton keeps each choice in its cache directory (TRITON_CACHE_DIR, default
# ~/.triton/cache), keyed by the Triton version, the GPU architecture, the kernel's source, the tuning key and
# the candidate configs, so a later process on the same kind of GPU reuses it instead of timing the candidates
# again (and every process picks the same tiles); delete that directory to tune again. `dot_rows` may skip its
# autotuner for configs timed in the graph step (`tuned_tiles`).
# Each candidate is timed for AUTOTUNE_REP_MS after AUTOTUNE_WARMUP_MS of warm-up (Triton's defaults, 100 and
# 25 ms, are meant for long kernels): these kernels take 5-100 us, so 20 ms is still hundreds of timed runs
# (the median is kept), and a fresh machine's start times each candidate 5x faster.
AUTOTUNE_WARMUP_MS = 5
AUTOTUNE_REP_MS = 20


def _bench(kernel_call, quantiles):
    from triton.testing import do_bench

    return do_bench(kernel_call, warmup=AUTOTUNE_WARMUP_MS, rep=AUTOTUNE_REP_MS, quantiles=quantiles)


def _autotune(configs: list, key: list[str], **kwargs):
    """`triton.autotune` with its results cached on disk, timing each candidate for AUTOTUNE_REP_MS."""
    return triton.autotune(configs=configs, key=key, cache_results=True, do_bench=_bench, **kwargs)


@functools.lru_cache(maxsize=16)
def _sm90_or_later(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _pdl(want: bool, device: torch.device) -> dict:
    """Launch options and the USE_PDL flag for one launch: PDL only where it is wanted and supported."""
    on = bool(want) and PDL_SUPPORTED and _sm90_or_later(device)
    return {"USE_PDL": True, "launch_pdl": True} if on else {"USE_PDL": False}


# `triton.cdiv` and `triton.next_power_of_2` are constexpr functions, whose calls from Python cost 4-6 us each
# (measured with Triton 3.9 on a CPU machine), and the launches make several per layer of every eager step.
def cdiv(a: int, b: int) -> int:
    """`triton.cdiv`: a / b rounded up."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """`triton.next_power_of_2`: the least power of two >= n (0 for 0)."""
    return 1 << (n - 1).bit_length() if n > 1 else max(n, 0)
