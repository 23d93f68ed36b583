"""engine/kernel_loads.py: Triton kernel builds counted through Triton's JIT hooks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tokenrouter.runtime.engine.kernel_loads import KernelLoads, describe, install


def test_builds_are_counted_through_tritons_hooks_keeping_the_hooks_set_before(monkeypatch):
    """Triton calls `jit_cache_hook` before a build and `jit_post_compile_hook` after it (the real hooks' keyword
    arguments); installed twice, the hooks wrap once, and hooks set before still run, in order."""
    knobs = pytest.importorskip("triton").knobs
    rt = knobs.runtime
    calls = []
    monkeypatch.setattr(rt, "jit_cache_hook", lambda **kw: calls.append(("before", kw["key"])))
    monkeypatch.setattr(rt, "jit_post_compile_hook", lambda **kw: calls.append(("after", kw["key"])))
    loads = KernelLoads()
    assert install(loads) and install(loads)
    fn = SimpleNamespace(name="_paged_attention_kernel")
    args = dict(repr="_paged_attention_kernel[num_warps=4](...)", fn=fn, compile={}, is_manual_warmup=False,
                already_compiled=False)  # fmt: skip
    start = loads.snapshot()
    for key in ("k1", "k2"):
        assert rt.jit_cache_hook(key=key, **args) is None  # not True: Triton goes on to build
        rt.jit_post_compile_hook(key=key, **args)
    assert calls == [("before", "k1"), ("after", "k1"), ("before", "k2"), ("after", "k2")]
    n, ms, names = loads.since(start)
    assert n == 2 and ms >= 0.0 and names == ["_paged_attention_kernel"] * 2
    # a hook without `fn` names the kernel from its repr
    rt.jit_cache_hook(key="k3", **{**args, "fn": None})
    rt.jit_post_compile_hook(key="k3", **{**args, "fn": None})
    assert loads.recent[-1] == "_paged_attention_kernel" and loads.count == 3
    # a hook set before that skips the build (returns True) is obeyed
    monkeypatch.setattr(rt, "jit_cache_hook", lambda **kw: True)
    other = KernelLoads()
    assert install(other) and rt.jit_cache_hook(key="k4", **args) is True
    # switched off: no hooks
    monkeypatch.setenv("TOKENROUTER_KERNEL_LOADS", "0")
    monkeypatch.setattr(rt, "jit_cache_hook", None)
    assert not install(KernelLoads()) and rt.jit_cache_hook is None


def test_a_stall_says_what_was_built_in_it():
    loads = KernelLoads()
    before = loads.snapshot()
    assert describe(*loads.since(before)) == "no Triton kernel built in it"
    for name in ("a", "b", "c", "d", "e"):
        loads.started()
        loads.ended(name)
    assert describe(*loads.since(before)).startswith("5 Triton kernel builds in it, ")
    assert describe(*loads.since(before)).endswith("ms (b, c, d, e)")  # the last four named
