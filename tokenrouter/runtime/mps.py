"""CUDA MPS for subservers that share a GPU.

Two processes on one GPU without MPS do not run kernels at the same time: the GPU time-slices between their
contexts, so while the large model's subserver runs a step the small model's waits, and the whole point of
asynchronous subservers is lost. Measured on the H200:
the 0.6B subserver's step took 4.5 ms next to a busy 8B subserver against 2.4 ms when the two ran in turn.

NVIDIA's Multi-Process Service lets kernels of several processes share the GPU's SMs. `serve` starts a
private MPS control daemon (its pipe and log folders inside the run directory, so it neither needs nor
touches a system-wide one) before the subservers, points them at it through `CUDA_MPS_PIPE_DIRECTORY` /
`CUDA_MPS_LOG_DIRECTORY`, and quits it at shutdown. `--mps auto` (the default) does this when two or more
local subservers share a GPU and `nvidia-cuda-mps-control` is installed, and warns when they share one
without it; `--mps on` makes a missing or failing MPS an error; `--mps off` never starts it.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

log = logging.getLogger("tokenrouter.launcher")

CONTROL = "nvidia-cuda-mps-control"
MODES = ("auto", "on", "off")


def shared_gpus(plan: dict, local: list[str]) -> list[int]:
    """GPU indices that two or more of the `local` models are placed on (a tensor-parallel model is on each of its
    `gpus:`)."""
    count = Counter(g for x in local for g in plan["models"][x].get("gpus") or [0])
    return sorted(g for g, n in count.items() if n > 1)


class MpsDaemon:
    def __init__(self, run_dir: Path) -> None:
        self.pipe = run_dir / "mps" / "pipe"
        self.logs = run_dir / "mps" / "log"
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.logs)}
        self.running = False

    def start(self) -> str | None:
        """Start the daemon and export its folders to child processes; None, or why it did not start."""
        exe = shutil.which(CONTROL)
        if exe is None:
            return f"{CONTROL} is not installed"
        self.pipe.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            r = subprocess.run([exe, "-d"], env={**os.environ, **self.env}, capture_output=True, text=True,
                               timeout=30)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{CONTROL} -d: {e}"
        if r.returncode != 0:
            return f"{CONTROL} -d exited {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}"
        os.environ.update(self.env)  # spawned subservers inherit it
        self.running = True
        return None

    def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        for k in self.env:
            os.environ.pop(k, None)
        exe = shutil.which(CONTROL)
        if exe is None:
            return
        try:
            subprocess.run([exe], input="quit\n", env={**os.environ, **self.env}, capture_output=True,
                           text=True, timeout=30)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("could not stop the MPS daemon: %s", e)


def _check_mps_models(plan: dict, cfg) -> None:
    """`--mps-sm` and `--mps-low` name models of the plan (a LaunchError otherwise)."""
    from tokenrouter.runtime.launch_checks import LaunchError

    for flag, names in (("--mps-sm", cfg.mps_sm), ("--mps-low", cfg.mps_low)):
        unknown = [x for x in names if x not in plan["models"]]
        if unknown:
            raise LaunchError(
                f"{flag} {unknown[0]}: no such model in the plan (models: {', '.join(plan['models'])})"
            )


def start_for_launch(run_dir: Path, plan: dict, local: list[str], cfg) -> MpsDaemon | None:
    """The daemon `serve` starts before the `local` subservers (None: none runs) under `cfg` (a ServeConfig):
    its `--mps`, `--mps-sm`, `--mps-low` and `--device`. A LaunchError where MPS was asked for and cannot
    run; a warning where GPU-sharing subservers run without it."""
    from tokenrouter.runtime.launch_checks import LaunchError

    _check_mps_models(plan, cfg)
    shared = shared_gpus(plan, local) if cfg.device != "cpu" else []
    needed = bool(cfg.mps_sm or cfg.mps_low)  # the flags that only MPS carries out
    if cfg.mps == "off" or (cfg.mps == "auto" and not shared and not needed):
        return None
    daemon = MpsDaemon(run_dir)
    why = daemon.start()
    if why is None:
        log.info("CUDA MPS started for the subservers (%s)", daemon.pipe)
    elif cfg.mps == "on" or needed:
        raise LaunchError(f"--mps {'on' if cfg.mps == 'on' else 'for --mps-sm / --mps-low'}: {why}")
    elif shutil.which("nvidia-smi"):  # a GPU machine: say what sharing without MPS costs
        print(f"tokenrouter: warning: subservers share GPU {shared} without CUDA MPS ({why}); their "
              "kernels will time-slice instead of running together (docs/serving.md)", file=sys.stderr)  # fmt: skip
    return daemon
