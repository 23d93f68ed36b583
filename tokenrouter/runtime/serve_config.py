"""`tokenrouter serve`'s settings (`ServeConfig`), each checked when the config is made: a `ValueError` whose
message names the flag."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from tokenrouter.runtime.frontend.config import BODY_TIMEOUT_S, MAX_BODY_BYTES

DEVICES = ("cpu", "cuda")


@dataclass(slots=True)
class ServeConfig:
    plan: str  # a .plan (JSON) file, or a .tr source compiled on the fly
    defines: dict[str, str] = field(
        default_factory=dict
    )  # -D NAME=VALUE: a .tr source's params, as compile's
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the printed URL has the one chosen)
    api_key: str | None = None
    tcp: bool = False
    device: str | None = None  # None: the plan's placement (CUDA when available, else CPU)
    startup_timeout_s: float = 600.0
    log_level: str = "warning"
    run_dir: str | None = None  # parent folder for the private run directory (default: the system temp dir)
    extra_subserver: dict = field(default_factory=dict)
    mode: str = "tokenrouter"  # or a baseline (runtime/modes.py)
    llm: str | None = None  # --mode llm-only: the model to serve (default: the largest)
    bind_host: str = "127.0.0.1"  # with tcp: launcher, frontend, local subservers bind (and are reached) here
    remote: dict[str, str] = field(default_factory=dict)  # model → "HOST:PORT": started by hand on that host
    heartbeat_timeout_s: float = 10.0  # a remote model silent this long is treated as dead
    liveness_timeout_s: float = 60.0  # a local subserver silent this long (frozen, stuck) is treated as dead
    mps: str = "auto"  # CUDA MPS for local subservers sharing a GPU: auto | on | off (runtime/mps.py)
    mps_sm: dict[str, int] = field(default_factory=dict)  # model → % of the GPU's SMs its kernels may use
    mps_low: list[str] = field(default_factory=list)  # models whose MPS client priority is below normal
    batch: dict[str, int] = field(default_factory=dict)  # --batch: thresholds replacing the plan's
    cpu_threads: int | None = None  # torch threads per subserver (None: threads_per_subserver)
    max_body_mib: float = MAX_BODY_BYTES / (1 << 20)  # a longer request body gets a 413 (FrontendArgs)
    body_timeout_s: float = BODY_TIMEOUT_S  # a request body not in full after this long gets a 408
    profile_dir: str | None = None  # POST /start_profile, /stop_profile write torch.profiler traces here
    prefix_cache: bool = True  # the engines' prefix cache (runtime/prefix_cache.py); --no-prefix-cache: off

    def __post_init__(self) -> None:
        self._check_policy()
        self._check_mps()
        self._check_remote()
        self._check_serving()

    def _check_policy(self) -> None:
        """-D, --cpu-threads, --profile-dir, --max-body-mib."""
        if self.defines and Path(self.plan).suffix != ".tr":
            raise ValueError("-D applies to a .tr policy; a plan's params are already bound")
        if self.defines and self.remote:
            raise ValueError(
                "-D with --remote: compile the policy with -D first and serve that plan, so that the remote "
                "subservers run the same one"
            )
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"--cpu-threads {self.cpu_threads}: at least 1")
        if self.profile_dir is not None:
            self.profile_dir = writable_folder(self.profile_dir, "--profile-dir")
        if not (math.isfinite(self.max_body_mib) and self.max_body_mib * (1 << 20) >= 1024):
            raise ValueError(f"--max-body-mib {self.max_body_mib:g}: a finite size of at least 1 KiB (0.001)")

    def _check_mps(self) -> None:
        from tokenrouter.runtime.mps import MODES as MPS_MODES

        if self.mps not in MPS_MODES:
            raise ValueError(f"--mps {self.mps}: expected one of {', '.join(MPS_MODES)}")
        for model, pct in self.mps_sm.items():
            if not 1 <= pct <= 100:
                raise ValueError(f"--mps-sm {model}={pct}: a percentage from 1 to 100")
            if self.mps == "off":
                raise ValueError("--mps-sm needs MPS (not --mps off)")
        if self.mps_low and self.mps == "off":
            raise ValueError("--mps-low needs MPS (not --mps off)")

    def _check_remote(self) -> None:
        """--remote, --bind-host, and the timeouts."""
        if self.remote:
            if not self.tcp:
                raise ValueError("--remote needs --tcp (subservers on other hosts talk over tcp://)")
            if self.mode != "tokenrouter":
                raise ValueError("--remote works with --mode tokenrouter only")
            for model, addr in self.remote.items():
                host, sep, port = addr.rpartition(":")
                if not model or not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
                    raise ValueError(f"--remote {model}={addr}: expected MODEL=HOST:PORT")
        if self.bind_host.strip("[]") in ("0.0.0.0", "::", "*", ""):
            raise ValueError(
                "--bind-host must be an address of this host that the remote hosts can reach (it is also the "
                f"address they connect to), not {self.bind_host!r}"
            )
        for flag, seconds in (("--heartbeat-timeout", self.heartbeat_timeout_s),
                              ("--liveness-timeout", self.liveness_timeout_s),
                              ("--body-timeout", self.body_timeout_s)):  # fmt: skip
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"{flag} must be a finite number of seconds > 0, got {seconds}")

    def _check_serving(self) -> None:
        """--mode, --llm, --port, --device, --api-key, the startup timeout, the log level."""
        from tokenrouter.runtime.modes import MODES

        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.llm is not None and self.mode != "llm-only":
            raise ValueError("--llm applies to --mode llm-only only")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        if self.device is not None and self.device not in DEVICES:
            raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key must not be empty")
        if self.startup_timeout_s <= 0:
            raise ValueError(f"the startup timeout must be > 0, got {self.startup_timeout_s}")
        if not isinstance(logging.getLevelName(self.log_level.upper()), int):
            raise ValueError(f"unknown log level {self.log_level!r}")


def writable_folder(path: str, flag: str) -> str:
    """`path` as an absolute folder this process can write into, made if missing; a ValueError that says why
    not."""
    folder = Path(path).expanduser().absolute()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{flag} {path}: not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot make the folder: {e.strerror or e}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: the folder is not writable")
    return str(folder)
