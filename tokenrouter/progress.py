"""A line on stderr every few seconds while a long step runs, so that a command that takes minutes is
seen to be working: `calibrate: 3/10 bisection steps, 24 s`. Nothing is printed for a step that ends
sooner than `EVERY_S`."""

from __future__ import annotations

import sys
import time
from typing import TextIO

EVERY_S = 3.0  # seconds between lines


class Progress:
    def __init__(
        self, label: str, total: int | None, unit: str, stream: TextIO | None = None, clock=time.monotonic
    ):
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream
        self.clock = clock
        self.start = self.last = clock()
        self.printed = False

    def update(self, done: int, note: str = "") -> None:
        """`done` units are done; print a line when `EVERY_S` has passed since the last one."""
        now = self.clock()
        if now - self.last >= EVERY_S:
            self.last = now
            self._line(done, note)

    def finish(self, done: int) -> None:
        """The step is over: a last line, where earlier lines were printed."""
        if self.printed:
            self._line(done, "done")

    def _line(self, done: int, note: str) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        extra = f" ({note})" if note else ""
        stream = self.stream or sys.stderr
        print(
            f"{self.label}: {done}{of} {self.unit}{extra}, {self.clock() - self.start:.0f} s",
            file=stream,
            flush=True,
        )
        self.printed = True
