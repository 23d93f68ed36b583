"""The CUDA devices this process sees and their memory, asked of the NVIDIA driver (libcuda) directly.

The launcher needs only these facts (is there a GPU, how many, how large) before it starts the subservers, and
importing torch for them cost the start about as long as the import itself (seconds on a machine whose disk
has not read torch yet), while the subservers waited to be spawned. The driver API answers in milliseconds and
honours CUDA_VISIBLE_DEVICES as torch does. It creates no context: no GPU memory is taken, and the processes
spawned later start clean.
"""

from __future__ import annotations

import ctypes
import functools

_LIBRARIES = ("libcuda.so.1", "libcuda.so")


def _driver():
    for name in _LIBRARIES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def device_memory() -> tuple[int, ...]:
    """Total bytes of memory of each visible CUDA device, in CUDA's order; empty without the driver, with a
    driver that does not initialize (no device, a broken install) or with no device visible."""
    lib = _driver()
    if lib is None or lib.cuInit(0) != 0:
        return ()
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return ()
    totals = []
    for i in range(count.value):
        dev, size = ctypes.c_int(0), ctypes.c_size_t(0)
        if (
            lib.cuDeviceGet(ctypes.byref(dev), i) != 0
            or lib.cuDeviceTotalMem_v2(ctypes.byref(size), dev) != 0
        ):
            return ()
        totals.append(size.value)
    return tuple(totals)


def device_count() -> int:
    """How many CUDA devices this process sees (0 without a usable driver)."""
    return len(device_memory())
