"""The arguments of a subserver process (`SubserverArgs`), in a module of their own: the launcher builds them
without importing the subserver's process module (which imports torch), and the child imports that itself."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field


@dataclass(slots=True)
class SubserverArgs:
    plan_path: str
    model: str
    endpoints: dict  # Endpoints.to_dict()
    device: str | None = None  # override the placement from the plan ("cpu", "cuda:1", ...)
    log_level: str = "INFO"
    stats_interval_s: float = 0.5
    max_batch: int = 256
    cpu_threads: int | None = None  # torch intra-op threads (None: threads_per_subserver)
    extra: dict = field(default_factory=dict)  # passed to load_engine as keyword arguments
    scheduler: str = "tokenrouter"  # "std-serving": the baseline's scheduler and prefix-caching engine
    busy_board: str | None = None  # the launcher's board of who is in a step (busy_board.py), or None
    require_cuda: bool = (
        False  # `serve --device cuda`: the plan's placement, and an error where torch has no CUDA
    )

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("SubserverArgs.model must name a model of the plan")
        for key in ("launcher", "frontend", "subservers"):
            if key not in self.endpoints:
                raise ValueError(f"SubserverArgs.endpoints lacks {key!r} (use Endpoints.to_dict())")
        if self.model not in self.endpoints["subservers"]:
            raise ValueError(f"SubserverArgs.endpoints has no address for model {self.model!r}")
        if self.stats_interval_s <= 0:
            raise ValueError(f"stats_interval_s must be > 0, got {self.stats_interval_s}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {self.cpu_threads}")
        if not isinstance(logging.getLevelName(self.log_level.upper()), int):
            raise ValueError(f"unknown log level {self.log_level!r}")
        if self.scheduler not in ("tokenrouter", "std-serving"):
            raise ValueError(f"scheduler must be 'tokenrouter' or 'std-serving', got {self.scheduler!r}")
