"""Which subservers sharing a GPU are in a step right now: one byte per model in a small file that every
subserver of the server maps (the launcher creates it in its run directory).

A subserver sets its byte for the length of each step and reads its co-runners' bytes (the models placed on
one of its GPUs, `models.*.gpus`) when a step starts: a step started while none of them was in one ran alone.
The scheduler counts those steps apart (`/metrics`: `tokenrouter_alone_steps_by_batch_total`), and
`tokenrouter profile --from-metrics` turns them into the profile's `alone_ms`, which the throughput model uses
for the steps a model starts while the others are idle (docs/throughput.md, "Contention by state"). The
bytes are advisory: a reader may see a step that has just ended or not yet see one that is starting.
"""

from __future__ import annotations

import mmap
from pathlib import Path


def create_board(path: str | Path, n_models: int) -> Path:
    """The board file for `n_models` subservers, every byte 0."""
    p = Path(path)
    p.write_bytes(b"\0" * max(1, n_models))
    return p


class BusyBoard:
    """One subserver's view of the board: its own byte (`index`) and its co-runners' (`beside`)."""

    def __init__(self, path: str | Path, index: int, beside: tuple[int, ...]) -> None:
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        size = len(self._map)
        if not 0 <= index < size or any(not 0 <= j < size or j == index for j in beside):
            self._map.close()
            raise ValueError(
                f"busy board {path}: index {index} / co-runners {beside} outside its {size} bytes"
            )
        self.index = index
        self.beside = tuple(beside)

    def any_beside(self) -> bool:
        """Whether a co-runner is in a step now."""
        return any(self._map[j] for j in self.beside)

    def set(self, busy: bool) -> None:
        self._map[self.index] = 1 if busy else 0

    def close(self) -> None:
        if not self._map.closed:
            self.set(False)
            self._map.close()
