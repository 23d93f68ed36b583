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

import struct
from collections.abc import Sequence

import torch

from tokenrouter.runtime.route.kernel import _TWO63, _TWO64, _U64, RouteBatchState, _pack_layout

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
        rows = len(position)
        cols = (seed, temperature, top_k, top_p, run_length, generated)
        if any(len(c) != rows for c in cols):
            raise ValueError(f"RouteBatchState.pack: columns differ in length ({[rows, *map(len, cols)]})")
        if rows == 0:
            return RouteBatchState.pack(self.device, seed=seed, position=position, temperature=temperature,
                                        top_k=top_k, top_p=top_p, run_length=run_length,
                                        generated=generated)  # fmt: skip
        bufs = self._by_rows.get(rows)
        if bufs is None:
            bufs = self._by_rows[rows] = _Buffers(rows, self.device)
        seeds = [int(x or 0) & _U64 for x in seed]
        seeds = [x - _TWO64 if x >= _TWO63 else x for x in seeds]
        host = bufs.next_host()
        try:
            bufs.layout.pack_into(
                host, 0, *seeds, *position, *run_length, *generated, *temperature, *top_p, *top_k
            )
        except (struct.error, OverflowError) as exc:
            raise ValueError(f"RouteBatchState.pack: a value out of its column's range ({exc})") from None
        bufs.send()
        seed_t, position_t, run_length_t, generated_t, temperature_t, top_p_t, top_k_t = bufs.views
        hot = [t > 0 for t in temperature]
        return RouteBatchState(
            seed=seed_t,
            position=position_t,
            temperature=temperature_t,
            top_k=top_k_t,
            top_p=top_p_t,
            run_length=run_length_t,
            generated=generated_t,
            any_sampling=any(hot),
            any_restricted=any(h and (k > 0 or p < 1) for h, k, p in zip(hot, top_k, top_p, strict=True)),
        )


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
        i64 = self.dev[: 32 * stride].view(torch.int64).view(4, stride)[:, :rows]
        f32 = self.dev[32 * stride : 40 * stride].view(torch.float32).view(2, stride)[:, :rows]
        top_k = self.dev[40 * stride : 40 * stride + 4 * rows].view(torch.int32)
        self.views = (
            *i64.unbind(),
            *f32.unbind(),
            top_k,
        )  # seed, position, run_length, generated, temp, top_p, top_k

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
