"""Building, in parallel, the Triton kernels that a start-up phase is about to launch.

Triton builds a kernel the first time a process launches it with a new specialization, on the launching
thread, one after another: on a fresh machine most of a plan's start went so (the CUDA graph capture's
forwards, the eager warm-up steps, the route kernel's variants; docs/results.md, start-up), with one core
busy of many. Inside `compile_ahead()` a Triton launch (`kernel[grid](...)`) runs nothing: it hands the build of
its kernel (of every candidate config, for an autotuned one) to a pool of threads, through Triton's own
`AsyncCompileMode`, and returns. Leaving the block waits for the builds and puts each kernel in its
`JITFunction`'s cache, so that the phase, run again for real, launches kernels already built. Triton's
compiler spends most of a build in its C++ passes and in `ptxas` (a child process), outside the GIL, so
threads build in parallel.

A phase is run inside the block only where its Python does not read what a kernel would have written (the
forward of a CUDA graph's shape does not: it is capturable), since no kernel runs there. A forward there runs
only the layers whose launches cover every layer's (`layers_to_build`): the layers of a decoder launch the same
kernels with the same specializations, and each launch, even of a kernel already built, costs Triton's Python
(an autotuned kernel's, one per candidate config). A build that fails
in the pool is left out of the cache; the real launch then builds it again and fails as it would have
without this module. Without Triton, under its interpreter (CPU) or with a Triton that has no
`AsyncCompileMode` (before 3.4), the block does nothing and the phase builds as it launches.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

MAX_WORKERS = 32
_lock = threading.Lock()  # one block at a time per process: the launch hook is the process's
_building = False  # inside an active block: launches only build (`layers_to_build`)


@dataclass(slots=True)
class Ahead:
    """What a `compile_ahead` block did: whether launches only built (`active`), the kernels handed to the pool
    (a specialization already built in this process is not handed again; one found in Triton's disk cache is
    read, not built), threads, wall time."""

    kernels: int = 0
    workers: int = 0
    seconds: float = 0.0
    active: bool = False
    pass_seconds: float = 0.0  # of `seconds`, the caller's pass inside the block (its launches handed over)

    def describe(self) -> str:
        if not self.active:
            return "kernels built as launched"
        return (
            f"{self.kernels} Triton kernel(s) prepared on {self.workers} threads in {self.seconds:.1f} s "
            f"(the launches {self.pass_seconds:.1f} s of it)"
        )


def default_workers() -> int:
    """The CPUs this process may run on (its affinity), at most MAX_WORKERS."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        n = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, n))


def _async_mode():
    """Triton's AsyncCompileMode and KernelInterface, or None where a block cannot build ahead."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    try:
        from triton.runtime._async_compile import AsyncCompileMode
        from triton.runtime.jit import KernelInterface
    except ImportError:
        return None
    if not hasattr(KernelInterface, "warmup"):
        return None
    return AsyncCompileMode, KernelInterface


def layers_to_build(layers):
    """The layers a forward runs: every one, except inside an active block, where the launches of a few cover
    all of theirs: the first two (a decoder's first layer has no earlier output to add to its residual stream,
    the second has) and each later layer whose parameters differ in name, shape or dtype from every kept one's.
    A later layer that still launched a specialization of its own would have it built at its real launch."""
    if not _building:
        return layers
    kept, seen = [], set()
    for i, layer in enumerate(layers):
        sig = tuple((name, tuple(p.shape), p.dtype) for name, p in layer.named_parameters())
        if i < 2 or sig not in seen:
            kept.append(layer)
            seen.add(sig)
    return kept


def _build_only(self, grid):
    """`kernel[grid]` inside a block: a call builds the kernel (Triton's `warmup`: under the async mode, a
    submission) and launches nothing. An autotuner's `warmup` builds every candidate config."""
    return lambda *args, **kwargs: self.warmup(*args, grid=grid, **kwargs)


@contextmanager
def compile_ahead(device, workers: int | None = None):
    """Inside: Triton launches only build their kernels, on `workers` threads (default `default_workers()`);
    on leaving, every build is waited for and cached. Yields an `Ahead`, filled in on leaving. Its `active`
    is False for a `device` other than CUDA (no Triton kernel is built there), without a Triton that can, and
    while another block is open (the hook is the process's: that block's launches stay build-only); the
    caller then skips the pass it would have run inside."""
    ahead = Ahead()
    on_cuda = str(device).startswith("cuda")
    found = _async_mode() if on_cuda else None
    if found is None or not _lock.acquire(blocking=False):  # nested or concurrent blocks build as launched
        yield ahead
        return
    global _building
    mode_cls, kernel_interface = found
    ahead.workers = workers or default_workers()
    start = time.perf_counter()
    pool = ThreadPoolExecutor(ahead.workers, thread_name_prefix="triton-build")
    original = kernel_interface.__getitem__
    try:
        mode = mode_cls(pool, ignore_errors=True)
        with mode:  # its exit waits for the builds and caches them
            kernel_interface.__getitem__ = _build_only
            ahead.active = _building = True
            yield ahead
            ahead.pass_seconds = time.perf_counter() - start
            ahead.kernels = len(mode.raw_futures)
    finally:
        _building = False
        kernel_interface.__getitem__ = original
        pool.shutdown(wait=True)
        ahead.seconds = time.perf_counter() - start
        _lock.release()


def build_ahead(device, build_pass) -> Ahead:
    """Run `build_pass()` (a phase's launches) inside a block of its own, where a block can be active (else
    not at all: the phase then builds as it launches); returns the block's `Ahead`."""
    with compile_ahead(device) as ahead:
        if ahead.active:
            build_pass()
    return ahead
