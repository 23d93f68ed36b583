"""Torch threads on the host's cores, one rule for `serve` and for the commands that run models in-process.

Torch's default is one intra-op thread per core it sees, in every process. Where the cores are shared (the
subservers of one plan, or a machine whose other work takes the cores), a parallel op waits on threads the
OS has descheduled: two subservers' warm-up took 57 s at 16 threads each and 1.8-8.2 s at 8 (on the H200
machine), and `calibrate` on two models in one process took minutes where one thread per model took
seconds. So each model gets the usable cores divided by the plan's models, as each subserver of `serve` does,
and an in-process command (`generate`, `calibrate`, `eval`, `train-router`, `profile`), whose models run one
after the other, gets the same count. `OMP_NUM_THREADS`, when set, is the user's choice and is kept.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The cores this process may run on: its CPU affinity (which taskset and cpusets narrow), and no more
    than a cgroup v2 CPU quota (a container's `--cpus`) allows."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def threads_per_model(models: int, cores: int | None = None) -> int:
    """Torch intra-op threads for each of a plan's `models`: the usable cores divided among them, at least one."""
    if models < 1:
        raise ValueError(f"models must be >= 1, got {models}")
    return max(1, (cores if cores is not None else usable_cores()) // models)


def set_torch_threads(models: int, threads: int | None = None) -> int:
    """Set torch's intra-op threads for a process that runs `models` models (`threads`: an explicit count);
    with `OMP_NUM_THREADS` set and no explicit count, torch keeps what that says. Returns the count."""
    import torch

    if threads is None and os.environ.get("OMP_NUM_THREADS", "").strip():
        return torch.get_num_threads()
    threads = threads or threads_per_model(models)
    torch.set_num_threads(threads)
    return threads
