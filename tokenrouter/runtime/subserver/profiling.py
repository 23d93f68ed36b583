"""A live server's steps under `torch.profiler`, started and stopped from the frontend (`POST /start_profile`,
`POST /stop_profile`, with `serve --profile-dir DIR`).

Each subserver process profiles its own decode loop: CPU activity, and the GPU's where its model is on one.
At the stop it writes a Chrome trace (open it in Perfetto or chrome://tracing) and a table of the ops' times
(`key_averages`) into the folder the frontend named, and answers with their paths. While a profile runs, the
scheduler marks its phases as regions of the trace (`region`): `tokenrouter.forward` (the engine's step),
`tokenrouter.route` (the route kernel) and `tokenrouter.commit` (tokens, hops, finishes). Off, a region is a
`nullcontext`: the hot path pays one global read.

The lockstep baseline runs every model in one process, which gets one `Profile` per model: the first start
starts its profiler, the first stop writes its one trace, and the repeats answer with the same files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from tokenrouter.runtime import messages as m

logger = logging.getLogger(__name__)

_active = False  # a profile runs in this process: `region` records


def region(name: str):
    """A named region of the trace while a profile runs, else a no-op context."""
    if not _active:
        return contextlib.nullcontext()
    import torch

    return torch.profiler.record_function(f"tokenrouter.{name}")


class LiveProfiler:
    """The profiler of one process (`label` names its files: the model, or the lockstep process's entry)."""

    def __init__(self, label: str, device: str) -> None:
        self.label = label
        self.device = str(device)
        self._prof = None
        self._files: list[str] = []  # the last profile's, answered to repeated stops (lockstep)

    @property
    def running(self) -> bool:
        return self._prof is not None

    def handle(self, msg: m.Profile) -> m.ProfileDone:
        try:
            files = self._start() if msg.start else self._stop(msg.out_dir)
            return m.ProfileDone(model=msg.model, start=msg.start, files=files)
        except Exception as exc:  # a profile must not take the server down: the frontend reports it
            logger.exception("profile %s failed", "start" if msg.start else "stop")
            self._prof = None
            _set_active(False)
            return m.ProfileDone(model=msg.model, start=msg.start, error=f"{type(exc).__name__}: {exc}")

    def _start(self) -> list[str]:
        if self._prof is None:
            import torch
            from torch.profiler import ProfilerActivity

            activities = [ProfilerActivity.CPU]
            if self.device.startswith("cuda"):
                activities.append(ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=activities)
            self._prof.start()
            self._files = []
            _set_active(True)
            logger.info("profiling (%s)", ", ".join(a.name for a in activities))
        return []

    def _stop(self, out_dir: str) -> list[str]:
        if self._prof is None:
            if not self._files:
                raise RuntimeError("no profile is running")
            return list(self._files)  # a repeated stop (the lockstep process gets one per model)
        prof, self._prof = self._prof, None
        _set_active(False)
        prof.stop()
        if not out_dir:  # discarded: another subserver's profiler failed to start
            return []
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        stem = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{self.label}-{os.getpid()}"
        trace, table = f"{stem}.trace.json", f"{stem}.ops.txt"
        prof.export_chrome_trace(trace)
        sort = "self_cuda_time_total" if self.device.startswith("cuda") else "self_cpu_time_total"
        Path(table).write_text(prof.key_averages().table(sort_by=sort, row_limit=40) + "\n")
        self._files = [trace, table]
        logger.info("profile written: %s", trace)
        return list(self._files)


def _set_active(on: bool) -> None:
    global _active
    _active = on
