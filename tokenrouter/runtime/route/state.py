"""`RouteStatePacker`: the scheduler's per-step `RouteBatchState.pack`, into buffers it keeps.

`RouteBatchState.pack` builds the same bytes every step, but makes a new host buffer, a new device buffer
and twelve tensor views of it each time (~20-30 µs of host time on a CPU; on CUDA also a pageable copy).
A packer keeps, per row count, a host buffer (a ring of pinned ones on CUDA, reused once the copy out of
it has completed) and one device buffer with its seven column views made once: a step writes the bytes
with `struct.pack_into` straight into the host buffer and, on an accelerator, makes one pinned
host-to-device copy. The layout, the values, the hints and the errors are `pack`'s
(`tests/kernels/test_route_state_pack.py` checks them bit for bit).

The tensors of a state it returns are views of its buffers: valid until its next `pack` with the same row
count, which overwrites every byte (also anything a kernel wrote into a column as scratch). The scheduler
uses a state only within its step; on an accelerator the next step's copy is ordered after the kernels
that read the previous one (same stream).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenrouter.runtime.route.kernel import (
    RouteBatchState,
    _check_pack_lengths,
    _column_views,
    _pack_into,
    _pack_layout,
)

RING = 4  # pinned host buffers per row count on an accelerator


class RouteStatePacker:
    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._by_rows: dict[int, _Buffers] = {}

    def pack(
        self,
        *,
        seed: Sequence[int | None],
        position: Sequence[int],
        temperature: Sequence[float],
        top_k: Sequence[int],
        top_p: Sequence[float],
        run_length: Sequence[int],
        generated: Sequence[int],
    ) -> RouteBatchState:
        """`RouteBatchState.pack(self.device, ...)`, in this packer's buffers (see the module doc)."""
        rows = _check_pack_lengths(seed, position, temperature, top_k, top_p, run_length, generated)
        if rows == 0:
            return RouteBatchState.pack(self.device, seed=seed, position=position, temperature=temperature,
                                        top_k=top_k, top_p=top_p, run_length=run_length,
                                        generated=generated)  # fmt: skip
        bufs = self._by_rows.get(rows)
        if bufs is None:
            bufs = self._by_rows[rows] = _Buffers(rows, self.device)
        _pack_into(
            bufs.layout, bufs.next_host(), seed, position, temperature, top_k, top_p, run_length, generated
        )
        bufs.send()
        return RouteBatchState.from_columns(bufs.views, temperature, top_k, top_p)


class _Buffers:
    """One row count's buffers: host (numpy views to write into), device, the seven column views."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.layout, stride = _pack_layout(rows)
        size = self.layout.size
        self.on_host = device.type == "cpu"
        pin = device.type == "cuda"
        n = 1 if self.on_host else RING
        self.hosts = [torch.zeros(size, dtype=torch.uint8, pin_memory=pin) for _ in range(n)]
        self.host_np = [h.numpy() for h in self.hosts]
        self.events: list[torch.cuda.Event | None] = [None] * n
        self.slot = 0
        self.dev = self.hosts[0] if self.on_host else torch.zeros(size, dtype=torch.uint8, device=device)
        self.views = _column_views(self.dev, rows, stride)  # made once per row count

    def next_host(self):
        """The host buffer to write this step's bytes into (on CUDA: once the copy out of it has completed)."""
        self.slot = (self.slot + 1) % len(self.hosts)
        ev = self.events[self.slot]
        if ev is not None:
            ev.synchronize()
        return self.host_np[self.slot]

    def send(self) -> None:
        if self.on_host:
            return
        cuda = self.dev.device.type == "cuda"
        self.dev.copy_(self.hosts[self.slot], non_blocking=cuda)  # pinned on CUDA; elsewhere a plain copy
        if cuda:
            ev = torch.cuda.Event()
            ev.record()
            self.events[self.slot] = ev
