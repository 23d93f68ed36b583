"""Triton kernels a process compiles, or loads from Triton's disk cache, while it runs.

Triton builds a kernel the first time a process launches it with a new specialization (its constexprs, the
arguments' alignment): from its on-disk cache where an earlier process of the machine compiled it, else by
compiling it, which takes about half a second. On the H200 the one-off stalls
of 290-570 ms at N = 16 were builds of the route kernel at a row count it had not met, which `RouteKernel.warm`
now launches at start; the model's own kernels met one in a step outside the captured graphs (a long extend, a
prefill: 1.1-1.6 s on a fresh machine; 1.2 s in a served benchmark of the 32B), which
`EmbeddedEngine.warm_eager` now runs at start, one step of each kind.

`install()` hooks Triton's JIT (`triton.knobs.runtime.jit_cache_hook`, called before a build, and
`jit_post_compile_hook`, after it), keeping any hooks already set, and counts the builds and their time. A
stalled step's log line then says how many builds it held. Under the Triton interpreter (CPU) no kernel is
built and the counts stay 0; without Triton, `install()` returns False. With hooks set, Triton serializes each
build's specialization (constants, options) for them before the build; `TOKENROUTER_KERNEL_LOADS=0` leaves the
hooks out, should that ever fail for a kernel.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class KernelLoads:
    """Kernel builds since `install()`: how many, their wall time, and the names of the last few."""

    count: int = 0
    ms: float = 0.0
    recent: list[str] = field(default_factory=list)
    _started: float | None = None

    def snapshot(self) -> tuple[int, float]:
        return self.count, self.ms

    def since(self, before: tuple[int, float]) -> tuple[int, float, list[str]]:
        """(builds, ms, the names of up to the last RECENT of them) since `before` (a `snapshot()`)."""
        n = self.count - before[0]
        return n, self.ms - before[1], self.recent[-min(n, RECENT) :] if n else []

    def started(self) -> None:
        self._started = time.perf_counter()

    def ended(self, name: str) -> None:
        self.count += 1
        if self._started is not None:
            self.ms += (time.perf_counter() - self._started) * 1000.0
            self._started = None
        self.recent = [*self.recent[-(RECENT - 1) :], name]


RECENT = 4  # names kept
LOADS = KernelLoads()  # this process's


def _name(kwargs: dict) -> str:
    fn = kwargs.get("fn")
    return str(getattr(fn, "name", None) or kwargs.get("repr", "?")).split("[")[0]


def install(loads: KernelLoads = LOADS) -> bool:
    """Count this process's Triton kernel builds into `loads` (once; True where the hooks are in place)."""
    if os.environ.get("TOKENROUTER_KERNEL_LOADS", "1") == "0":
        return False
    try:
        from triton import knobs
    except ImportError:  # no Triton, or one without knobs (before 3.4)
        return False
    rt = knobs.runtime
    before, after = rt.jit_cache_hook, rt.jit_post_compile_hook
    if getattr(before, "kernel_loads", None) is loads:
        return True

    def cache_hook(**kwargs):
        loads.started()
        return before(**kwargs) if before is not None else None  # True from a hook set before skips the build

    def post_hook(**kwargs):
        loads.ended(_name(kwargs))
        return after(**kwargs) if after is not None else None

    cache_hook.kernel_loads = loads
    rt.jit_cache_hook, rt.jit_post_compile_hook = cache_hook, post_hook
    return True


def describe(n: int, ms: float, names: list[str]) -> str:
    """A stall log line's account of the kernel builds in the step."""
    if n == 0:
        return "no Triton kernel built in it"
    return f"{n} Triton kernel build{'s' if n > 1 else ''} in it, {ms:.0f} ms ({', '.join(names)})"
