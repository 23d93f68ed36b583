"""The work of `tokenrouter serve` and `tokenrouter subserver` before the launcher (`runtime/launcher.py`) or
the subserver process (`runtime/subserver/process.py`) takes over: the options checked and turned into their
configs. A usage mistake raises `ValueError`; a plan or deployment that cannot run raises `LaunchError`."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from tokenrouter.options import defines, name_values
from tokenrouter.runtime.ipc import Endpoints
from tokenrouter.runtime.launcher import LaunchError, ServeConfig, load_plan


def _check_plan_and_timeouts(plan: str, fields: dict) -> None:
    if not os.path.isfile(plan):
        raise ValueError(f"no such plan: {plan}")
    for flag, key in (
        ("--startup-timeout", "startup_timeout_s"),
        ("--heartbeat-timeout", "heartbeat_timeout_s"),
    ):
        if not (math.isfinite(fields[key]) and fields[key] > 0):
            raise ValueError(f"{flag} must be a finite number of seconds > 0, got {fields[key]}")


def serve_config(
    plan: str,
    *,
    define: list[str] | None,
    remote: list[str] | None,
    mps_sm: list[str] | None,
    mps_low: list[str] | None,
    batch: list[str] | None,
    **fields,
) -> ServeConfig:
    """`serve`'s ServeConfig: `fields` by ServeConfig's names, the repeated options as the command line gave
    them (NAME=VALUE)."""
    _check_plan_and_timeouts(plan, fields)
    remotes = name_values(remote, "--remote", "MODEL=HOST:PORT", lambda v: bool(v.strip()))
    sm_caps = name_values(mps_sm, "--mps-sm", "MODEL=PERCENT", lambda v: v.strip().isdigit())
    thresholds = name_values(batch, "--batch", "MODEL=B", lambda v: v.strip().isdigit())
    return ServeConfig(
        plan=plan,
        remote={name: addr.strip() for name, addr in remotes.items()},
        mps_sm={name: int(pct) for name, pct in sm_caps.items()},
        mps_low=list(mps_low or []),
        batch={name: int(b) for name, b in thresholds.items()},
        defines=defines(define),
        **fields,
    )


def parse_endpoints(text: str) -> Endpoints:
    """`subserver --endpoints`: the JSON that `serve --remote` prints, or a file holding it."""
    try:
        return Endpoints.parse(text)
    except ValueError as exc:
        kind = _json_kind(text)
        if kind is None:
            raise
        raise ValueError(
            f'--endpoints: expected a JSON object {{"launcher": URL, "frontend": URL, "subservers": '
            f"{{MODEL: URL}}}} (the JSON that `tokenrouter serve` prints), got {kind}"
        ) from exc


def _json_kind(text: str) -> str | None:
    """What JSON other than an object `text` is ("an array", …), when it is no file name; else None."""
    try:  # JSON of another shape is no file name: say which shape it must have
        if os.path.exists(text):
            return None
        other = json.loads(text)
    except ValueError:
        return None
    kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return None if isinstance(other, dict) else kinds.get(type(other), "a number")


def run_remote_subserver(
    plan: str, model: str, eps: Endpoints, options: dict, log: Callable[[str], None]
) -> None:
    """Run `model`'s subserver of `plan` in the foreground until Shutdown or a signal. `options`: device,
    log_level, cpu_threads, prefix_cache as `subserver` takes them; `log` gets the status lines. Raises
    `ValueError` for a bad option, `LaunchError` for a plan that does not fit the endpoints or a failed run."""
    from tokenrouter.runtime.subserver.process import SubserverArgs, run_subserver_process

    device = options["device"]
    if device is not None and device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    with tempfile.TemporaryDirectory(prefix="tokenrouter-subserver-") as tmp:
        spec, plan_path = _remote_plan(plan, model, eps, Path(tmp))
        if device == "cuda":
            device = f"cuda:{(spec['models'][model].get('gpus') or [0])[0]}"
        args = SubserverArgs(plan_path=plan_path, model=model, endpoints=eps.to_dict(), device=device,
                             log_level=options["log_level"].upper(), cpu_threads=options["cpu_threads"],
                             extra={"prefix_cache": options["prefix_cache"]})  # fmt: skip
        log(f"tokenrouter: subserver {model!r} on {eps.subservers[model]}")
        try:
            run_subserver_process(args)
        except SystemExit as exc:
            raise LaunchError(f"subserver {model!r} failed (see the log above)") from exc
        log(f"tokenrouter: subserver {model!r} stopped")


def _remote_plan(plan: str, model: str, eps: Endpoints, run_dir: Path) -> tuple[dict, str]:
    """The plan `serve` runs, read into `run_dir`, after checking that it has `model`, the same models as the
    endpoints, and (for the embedded engine) the model's folder on this host."""
    spec, plan_path = load_plan(plan, run_dir)
    if model not in spec["models"]:
        raise LaunchError(f"{plan}: no model {model!r} (models: {', '.join(spec['models'])})")
    if model not in eps.subservers or set(eps.subservers) != set(spec["models"]):
        raise LaunchError(
            f"--endpoints names models {sorted(eps.subservers)}, the plan {sorted(spec['models'])}: "
            "is this the plan `serve` runs?"
        )
    folder = Path(spec["models"][model]["path"])
    if spec["models"][model].get("engine", "embedded") == "embedded" and not folder.is_dir():
        raise LaunchError(f"model {model!r}: no model folder at {folder}")
    return spec, plan_path
