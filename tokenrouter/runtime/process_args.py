"""From the plan and `serve`'s settings to what each process is started with: a subserver's `SubserverArgs` and
environment, the frontend's `FrontendArgs`, and the command a remote model's subserver is started by on its
host."""

from __future__ import annotations

import json
from pathlib import Path

from tokenrouter.runtime.ipc import Endpoints
from tokenrouter.runtime.serve_config import ServeConfig


def local_models(plan: dict, cfg: ServeConfig, lockstep: bool) -> list[str]:
    """The models whose subserver this host starts: not a remote one (started by hand on its host), and with
    `lockstep`, the entry's only (its process drives every model)."""
    return [
        name for name in plan["models"] if not (lockstep and name != plan["entry"]) and name not in cfg.remote
    ]


def busy_board(plan: dict, run_dir: Path, setup) -> str | None:
    """Models sharing a GPU, under TokenRouter's own scheduler: the board of who is in a step when (None:
    no board)."""
    from tokenrouter.compiler.plan import co_runners
    from tokenrouter.runtime.subserver.busy_board import create_board

    if setup.lockstep or setup.scheduler != "tokenrouter" or not any(co_runners(plan).values()):
        return None
    return str(create_board(run_dir / "busy-board", len(plan["models"])))


def subserver_args(cfg: ServeConfig, setup, model: str, plan_path: str, eps: dict, board: str | None):
    """The `SubserverArgs` of a local model's process (`setup`: the mode's `ModeSetup`)."""
    from tokenrouter.runtime.subserver.args import SubserverArgs

    extra = {**setup.engine_overrides, "prefix_cache": cfg.prefix_cache, **cfg.extra_subserver}
    return SubserverArgs(
        plan_path=plan_path,
        model=model,
        endpoints=eps,
        # --device cuda: None = the model's own `gpu:`, which the subserver checks against the visible GPUs
        device="cpu" if cfg.device == "cpu" else None,
        require_cuda=cfg.device == "cuda",  # the launcher asked the driver only (cuda_info), not torch
        log_level=cfg.log_level.upper(),
        extra=extra,
        scheduler=setup.scheduler,
        busy_board=board,
        cpu_threads=cfg.cpu_threads,
    )


def frontend_args(cfg: ServeConfig, plan: dict, eps: dict, run_dir: Path):
    """The frontend process's `FrontendArgs`."""
    from tokenrouter.compiler.plan import routing_digest
    from tokenrouter.runtime.frontend.config import FrontendArgs

    caps = [s["max_len"] for s in plan["models"].values() if s.get("max_len")]
    return FrontendArgs(
        policy=plan["policy"]["name"],
        entry=plan["entry"],
        models=list(plan["models"]),
        model_dir=plan["models"][plan["entry"]]["path"],
        endpoints=eps,
        host=cfg.host,
        port=cfg.port,
        api_key=cfg.api_key,
        run_dir=str(run_dir),
        max_len=min(caps) if caps else None,
        log_level=cfg.log_level.lower(),
        remote=list(cfg.remote),
        heartbeat_timeout_s=cfg.heartbeat_timeout_s,
        liveness_timeout_s=cfg.liveness_timeout_s,
        max_body_bytes=int(cfg.max_body_mib * (1 << 20)),
        body_timeout_s=cfg.body_timeout_s,
        routing=routing_digest(plan),
        profile_dir=cfg.profile_dir,
    )


def child_env(cfg: ServeConfig, model: str) -> dict[str, str]:
    """The MPS settings of a model's subserver process (`--mps-sm`, `--mps-low`)."""
    env = {}
    if (pct := cfg.mps_sm.get(model)) is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
    if model in cfg.mps_low:  # MPS client priority 1 = below normal (0, normal, is the default)
        env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
    return env


def remote_command(cfg: ServeConfig, endpoints: Endpoints, model: str) -> str:
    """The command that starts a remote model's subserver on its host (the plan copied to the same path)."""
    import shlex

    cmd = ["tokenrouter", "subserver", cfg.plan, "--model", model]
    cmd += ["--endpoints", json.dumps(endpoints.to_dict(), separators=(",", ":"))]
    if cfg.device is not None:
        cmd += ["--device", cfg.device]
    cmd += ["--log-level", cfg.log_level]
    if not cfg.prefix_cache:
        cmd += ["--no-prefix-cache"]
    return shlex.join(cmd)
