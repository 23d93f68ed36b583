"""engine/compile_ahead.py: inside the block a Triton launch only builds its kernel, through Triton's
AsyncCompileMode on a thread pool; leaving waits for the builds. The kernels here are Triton `KernelInterface`s
that record their calls (a real build needs a CUDA driver; the GPU start-up runs the real ones).

Triton is imported inside the tests, never at collection: tests/engine_gpu/conftest.py must choose Triton's
interpreter before anything imports it."""

from __future__ import annotations

import inspect
import threading

import pytest

from tokenrouter.runtime.engine import compile_ahead as ca


@pytest.fixture
def recorder(monkeypatch):
    """A `KernelInterface` class that records each `run`; a build-only call (`warmup`) submits a build the way
    `JITFunction._do_compile` does under the async mode: keyed, so that a second submission of a key is the
    first's. Triton is compiled, not interpreted, whatever the process chose (tests/engine_gpu/conftest.py)."""
    pytest.importorskip("triton")
    _async = pytest.importorskip("triton.runtime._async_compile")
    from triton.runtime.jit import KernelInterface

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    class Recorder(KernelInterface):
        def __init__(self) -> None:
            self.calls: list[tuple] = []
            self.built: dict[str, str] = {}  # key -> the thread that built it

        def run(self, *args, grid, warmup, **kwargs):
            self.calls.append((args, grid, warmup, kwargs))
            mode = _async.active_mode.get()
            if warmup and mode is not None:
                key = f"{kwargs.get('BLOCK')}"
                fns = [
                    lambda: threading.current_thread().name,
                    lambda name: self.built.__setitem__(key, name),
                ]
                if "cleanup_fn" in inspect.signature(mode.submit).parameters:  # Triton 3.7 on
                    fns.append(lambda future_kernel: None)
                return mode.submit(key, *fns)
            return "launched"

    return Recorder


def test_launches_inside_only_build_on_pool_threads_and_leaving_waits_for_the_builds(recorder):
    k = recorder()
    with ca.compile_ahead("cuda:0", workers=3) as ahead:
        assert ahead.active and ahead.workers == 3
        for block in (16, 32, 16, 64):  # 16 twice: one build
            assert k[(4, 1)](7, BLOCK=block) is not None
    assert [c[2] for c in k.calls] == [True] * 4 and [c[1] for c in k.calls] == [(4, 1)] * 4
    assert ahead.kernels == 3 and ahead.seconds >= ahead.pass_seconds > 0.0
    assert sorted(k.built) == ["16", "32", "64"]
    assert all(name.startswith("triton-build") for name in k.built.values())
    assert (
        "3 Triton kernel(s) prepared on 3 threads" in ahead.describe() and "(the launches" in ahead.describe()
    )
    # after the block a launch launches again
    assert k[(2,)](7, BLOCK=16) == "launched" and k.calls[-1][2] is False


def test_the_launch_hook_is_put_back_when_the_block_raises(recorder):
    from triton.runtime.jit import KernelInterface

    before = KernelInterface.__getitem__
    with pytest.raises(RuntimeError, match="boom"), ca.compile_ahead("cuda", workers=1):
        assert KernelInterface.__getitem__ is not before
        raise RuntimeError("boom")
    assert KernelInterface.__getitem__ is before
    assert recorder()[(1,)](BLOCK=8) == "launched"


def test_a_nested_block_is_inactive_and_the_outer_one_still_builds_only(recorder):
    k = recorder()
    with ca.compile_ahead("cuda", workers=2) as outer:
        with ca.compile_ahead("cuda", workers=2) as inner:
            assert outer.active and not inner.active
            k[(1,)](BLOCK=8)
        assert inner.describe() == "kernels built as launched"
    assert k.calls[0][2] is True and outer.kernels == 1


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_off_cuda_or_under_the_interpreter_nothing_is_built_ahead(recorder, monkeypatch, device):
    if device == "cuda":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    k = recorder()
    with ca.compile_ahead(device) as ahead:
        assert not ahead.active
        assert k[(1,)](BLOCK=8) == "launched"
    assert ahead.kernels == 0 and not ahead.active


def test_default_workers_are_the_cpus_this_process_may_use():
    assert 1 <= ca.default_workers() <= ca.MAX_WORKERS


def test_a_forward_in_an_active_block_runs_the_layers_that_cover_every_layers_launches(recorder):
    """Layers of one shape launch the same specializations: inside a block the first two run (the first adds
    no earlier output to its residual stream) and each later one of another shape; outside, every layer."""
    from torch import nn

    layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(5)] + [nn.Linear(4, 8), nn.Linear(4, 4)])
    assert list(ca.layers_to_build(layers)) == list(layers)
    with ca.compile_ahead("cuda:0", workers=1) as ahead:
        assert ahead.active
        assert ca.layers_to_build(layers) == [layers[0], layers[1], layers[5]]
    assert list(ca.layers_to_build(layers)) == list(layers)

    from tokenrouter.runtime.engine.attention import triton_backend
    from tokenrouter.runtime.engine.models import decoder

    assert decoder.layers_to_build is ca.layers_to_build is triton_backend.layers_to_build  # both forwards'
