"""A faster Triton interpreter for the CPU tests: `install()` makes a kernel run patch triton.language once.

Triton's interpreter re-patches the language modules (an `inspect.getmembers` scan of triton.language, its
tensor class and math module, a few milliseconds) at every call of a device function inside a kernel:
every `tl.sum`, `tl.max`, `tl.reshape` and every `@triton.jit` helper. Under cProfile that was 55 of the
126 s of one fused-forward test. The patches a repeat call makes are the ones already in place (they
depend only on which language modules the function's globals hold: `triton.language` or its `core`), so
`install()` lets the first call per set of modules in a kernel run patch, as before, and makes the repeats
no-ops; the kernels compute the same values. It also makes a tensor's `__index__` (a loop bound taken
from `tl.program_id`) work in Triton 3.6's interpreter under numpy 2, as it does in 3.7 and later, and
makes 3.6-3.8's `tl.fma` round once, as 3.9's and the GPU's do. Two more costs go: the interpreter's
numpy-dtype lookup (memoized) and the integer overflow checks it builds and then drops without `debug`.
Where this Triton's interpreter lacks the two functions it wraps, `install()` leaves it alone and returns
False.

Installed by tests/engine_gpu/conftest.py (after it sets TRITON_INTERPRET: triton must not be imported
before that) and by the scripts under tests/kernels/ that run the interpreter in a fresh process."""

from __future__ import annotations

import inspect


def _index(self) -> int:
    """A tensor as a Python int (a loop bound): Triton 3.6's interpreter takes `int(data)`, which numpy 2
    refuses for the one-element arrays that `tl.program_id` gives there; 3.7 and later squeeze first."""
    return int(self.handle.data.squeeze())


def _create_fma(self, x, y, z):
    """`tl.fma` rounded once, as on the GPU (the route kernel's rounding correction depends on it): a float32
    product is exact in float64, so the sum is rounded once there and once more to float32; the result can
    differ from the fused one only where the float64 sum lands exactly halfway between two float32 values
    (rare, and within the tests' tolerances). Other dtypes as before."""
    import numpy as np
    from triton.runtime.interpreter import TensorHandle

    if z.data.dtype == np.float32:
        wide = x.data.astype(np.float64) * y.data.astype(np.float64) + z.data.astype(np.float64)
        return TensorHandle(wide.astype(np.float32), z.dtype.scalar)
    return TensorHandle(x.data * y.data + z.data, z.dtype.scalar)


def _memoized_np_dtype(original):
    """The interpreter's `_get_np_dtype` (Triton dtype -> numpy dtype), memoized by scalar type: the original
    builds its 19-entry table, hashing every key, on each of the hundreds of thousands of calls a fused-forward
    test makes (a tenth of the interpreter's time there)."""
    import triton.language as tl

    cache: dict = {}

    def np_dtype(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(key, tl.pointer_type):  # unhashable; the original answers it at its first line
            return original(key)
        found = cache.get(key)
        if found is None:
            found = cache[key] = original(key)
        return found

    return np_dtype


def _skip_unasserted_overflow_checks(builder) -> None:
    """Without `debug`, the interpreter still builds each integer add, sub and mul's overflow check (both sides
    cast to int64, the op again, two comparisons) and then drops it: its `device_assert` only asserts under
    `debug`. That was 31 % of a route-kernel check's time. With `debug` off nothing is checked either way, so
    the checks are not built; with it on, they stay."""
    options = getattr(builder, "options", None)
    if (
        options is not None
        and not getattr(options, "debug", True)
        and getattr(options, "sanitize_overflow", False)
    ):
        import dataclasses

        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def install() -> bool:
    try:
        import triton.language as tl
        import triton.runtime.interpreter as ti

        patch_lang, run_grid, scope = ti._patch_lang, ti.GridExecutor.__call__, ti._LangPatchScope
    except (ImportError, AttributeError):
        return False
    if getattr(ti, "_patched_once_per_run", False):
        return True
    state = {"depth": 0, "done": set()}
    keys: dict = {}  # (id, size) of a globals dict -> the language modules in it (recomputed if it grows)

    def modules(fn) -> frozenset:
        g = fn.__globals__
        key = keys.get((id(g), len(g)))
        if key is None:
            key = keys[(id(g), len(g))] = frozenset(
                id(v) for v in g.values() if inspect.ismodule(v) and v in (tl, tl.core)
            )
        return key

    def patch_lang_index(fn):
        patched = patch_lang(fn)
        patched.set_attr(tl.core.tensor, "__index__", _index)  # restored with the interpreter's own patches
        return patched

    def patch_once(fn):
        if not state["depth"]:  # outside a kernel run: as before
            return patch_lang_index(fn)
        key = modules(fn)
        if key in state["done"]:
            return scope()  # nothing to patch (and so nothing to restore)
        state["done"].add(key)
        return patch_lang_index(fn)

    def run(self, *args, **kwargs):
        state["depth"] += 1
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            state["depth"] -= 1
            if not state["depth"]:
                state["done"].clear()  # the run's own patches are restored by now: patch again next run

    builder = getattr(ti, "InterpreterBuilder", None)
    if builder is not None and "fma_fp" not in inspect.getsource(builder.create_fma):
        builder.create_fma = _create_fma  # Triton 3.6-3.8: x * y + z, rounded twice
    ti._patch_lang = patch_once
    if hasattr(ti, "_get_np_dtype"):
        ti._get_np_dtype = _memoized_np_dtype(ti._get_np_dtype)
    _skip_unasserted_overflow_checks(getattr(ti, "interpreter_builder", None))
    ti.GridExecutor.__call__ = run
    ti._patched_once_per_run = True
    return True
