"""Two models "on two GPUs" on CPU: each model of a plan gets its own fake device name, is loaded on the
CPU, and records which device was current (`embedded.device_scope`) at every forward. A command that steps
several engines in one process must make each model's device current around that model's work (Triton and
CUDA graphs run on the current device); the records show whether it does."""

from __future__ import annotations

import contextlib
from pathlib import Path

import tokenrouter.runtime.engine.embedded as embedded
import tokenrouter.runtime.subserver.loading as loading


def record_scopes(monkeypatch, module) -> list[str | None]:
    """Replace `module.device_scope` by one that only records: the returned list's one item is the device
    made current (as a string), None outside every scope."""
    current: list[str | None] = [None]

    @contextlib.contextmanager
    def scope(device):
        before, current[0] = current[0], str(device)
        try:
            yield
        finally:
            current[0] = before

    monkeypatch.setattr(module, "device_scope", scope)
    return current


def fake_devices(monkeypatch, loader: str) -> list[tuple[str, str | None]]:
    """Patch `loading.pick_device` (a model's device: "fake-" + its folder's name), `loading.<loader>`
    ("load_model_engine" or "load_model_runtime": loads on the CPU) and `embedded.device_scope`. Returns the
    list that every forward / forward_full appends (the engine's fake device, the current one) to."""
    current = record_scopes(monkeypatch, embedded)
    seen: list[tuple[str, str | None]] = []

    def watched(engine, fake: str):
        for name in ("forward", "forward_full"):
            fn = getattr(engine, name)

            def wrapped(*a, _fn=fn, **k):
                seen.append((fake, current[0]))
                return _fn(*a, **k)

            monkeypatch.setattr(engine, name, wrapped)
        return engine

    original = getattr(loading, loader)

    def load(plan, model, device, **kw):
        got = original(plan, model, "cpu", **kw)
        if isinstance(got, tuple):  # (engine, route kernel)
            return (watched(got[0], device), *got[1:])
        return watched(got, device)

    monkeypatch.setattr(
        loading,
        "pick_device",
        lambda spec, override=None, require_cuda=False: f"fake-{Path(spec['path']).name}",
    )
    monkeypatch.setattr(loading, loader, load)
    return seen
