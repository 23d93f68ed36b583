"""Which subservers sharing a GPU stepped while another did: one step counter per model in a small file that
every subserver of the server maps (the launcher creates it in its run directory).

A subserver adds one to its counter when a step starts and one when it ends, so an odd count means "in a
step". Around each of its own steps it reads its co-runners' counters (the models placed on one of its GPUs,
`models.*.gpus`): the step ran alone when every co-runner's count was even at its start and unchanged at its
end, so that no co-runner step overlapped it at all. A co-runner that is between two back-to-back steps, or
that starts one a moment later on a hop this step's predecessor sent, makes the step not alone.

The scheduler counts the alone steps apart (`/metrics`: `tokenrouter_alone_steps_by_batch_total`), and
`tokenrouter profile --from-metrics` turns them into the profile's `alone_ms`, which the throughput model uses
for the steps a model starts while the others wait (docs/tuning.md). The counters
are advisory (no lock): they feed the profile, never scheduling.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

_SLOT = struct.Struct("<I")  # one 4-byte, 4-byte-aligned counter per model; it wraps at 2**32


def create_board(path: str | Path, n_models: int) -> Path:
    """The board file for `n_models` subservers, every counter 0."""
    p = Path(path)
    p.write_bytes(b"\0" * _SLOT.size * max(1, n_models))
    return p


class BusyBoard:
    """One subserver's view of the board: its own counter (`index`) and its co-runners' (`beside`)."""

    def __init__(self, path: str | Path, index: int, beside: tuple[int, ...]) -> None:
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        size = len(self._map) // _SLOT.size
        if not 0 <= index < size or any(not 0 <= j < size or j == index for j in beside):
            self._map.close()
            raise ValueError(
                f"busy board {path}: index {index} / co-runners {beside} outside its {size} models"
            )
        self.index = index
        self.beside = tuple(beside)
        self._own = self._read(index)

    def _read(self, j: int) -> int:
        return _SLOT.unpack_from(self._map, _SLOT.size * j)[0]

    def _bump(self) -> None:
        self._own = (self._own + 1) & 0xFFFFFFFF
        _SLOT.pack_into(self._map, _SLOT.size * self.index, self._own)

    def busy(self) -> bool:
        """Whether this subserver is in a step (its count is odd)."""
        return bool(self._own & 1)

    def start(self) -> tuple[int, ...] | None:
        """Mark this subserver in a step; the co-runners' counts at its start, or None when one of them was
        in a step then (the step is not alone)."""
        seen = tuple(self._read(j) for j in self.beside)
        if not self.busy():
            self._bump()
        return None if any(c & 1 for c in seen) else seen

    def end(self, seen: tuple[int, ...] | None) -> bool:
        """Mark the step ended; whether it ran alone: `seen` (from `start`) was not None and no co-runner's
        count moved since."""
        if self.busy():
            self._bump()
        return seen is not None and seen == tuple(self._read(j) for j in self.beside)

    def close(self) -> None:
        if not self._map.closed:
            if self.busy():
                self._bump()
            self._map.close()
