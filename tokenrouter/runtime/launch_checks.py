"""What `serve` checks before it starts a process (the plan, the model folders, the tokenizers, the port, the
device), and the deployment's ZeroMQ endpoints. A problem is a `LaunchError` whose message says what and where."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from tokenrouter.runtime.ipc import Endpoints, new_key, tcp_url


class LaunchError(Exception):
    """A problem with the user's input or environment; the message says what and where (exit status 1)."""


def load_plan(path: str, run_dir: Path, defines: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """(plan, path of a plan file the subservers can read). A .tr source is compiled into run_dir, its params
    overridden by `defines` (`-D`); a model given as a hub id is fetched into the hub cache unless there (or
    offline) and the plan written into run_dir names its local folder."""
    from tokenrouter.compiler.driver import load_plan as load
    from tokenrouter.compiler.plan import PlanError, write_plan
    from tokenrouter.hub import HubError, resolve_models

    if not Path(path).exists():
        raise LaunchError(f"{path}: no such file")
    try:
        plan = load(path, defines)
        fetched = resolve_models(plan, fetch=True, source=path)
    except (PlanError, HubError) as e:
        raise LaunchError(str(e)) from None
    if Path(path).suffix == ".tr" or fetched:
        path = str(run_dir / "plan.json")
        write_plan(plan, path)
        plan = load(path)  # as the subservers will read it
    return plan, path


def check_models(plan: dict[str, Any]) -> None:
    """Every model folder exists (the embedded engine loads local folders only); the entry has a tokenizer."""
    for name, spec in plan["models"].items():
        folder = Path(spec["path"])
        if spec.get("engine", "embedded") == "embedded" and not folder.is_dir():
            raise LaunchError(f"model {name!r}: no model folder at {folder}")
    entry = Path(plan["models"][plan["entry"]]["path"])
    if entry.is_dir() and not (entry / "tokenizer.json").is_file():
        raise LaunchError(f"entry model {plan['entry']!r}: no tokenizer.json in {entry}")


def check_vocab(plan: dict[str, Any]) -> None:
    """The models served share one tokenizer (`compiler.vocab`): checked again here, for a plan compiled
    elsewhere or whose model folders changed since."""
    from tokenrouter.compiler.vocab import vocab_problems

    names = sorted(plan["models"], key=lambda name: name != plan["entry"])
    problems = vocab_problems({name: plan["models"][name]["path"] for name in names})
    if problems:
        raise LaunchError(problems[0][1])


def check_port(host: str, port: int) -> None:
    """Fail before loading any model when the HTTP port is taken (the frontend still reports a later race)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise LaunchError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """What to tell a user who serves on an address other hosts can reach without an API key (None: nothing)."""
    import ipaddress

    if api_key or host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host.strip("[]")).is_loopback:
            return None
    except ValueError:
        pass  # a host name: it may resolve to anything
    return (
        f"--host {host} without --api-key: anyone who can reach this port can use the models "
        "(set --api-key or TOKENROUTER_API_KEY)"
    )


def check_device(device: str | None) -> None:
    if device == "cuda":
        from tokenrouter.runtime.cuda_info import device_count

        if not device_count():
            raise LaunchError("--device cuda: no CUDA device is available here (use --device cpu)")


def check_remote(plan: dict[str, Any], remote: dict[str, str]) -> None:
    """Every `--remote` model is one of the plan's."""
    unknown = [x for x in remote if x not in plan["models"]]
    if unknown:
        raise LaunchError(
            f"--remote {unknown[0]}: no such model in the plan (models: {', '.join(plan['models'])})"
        )


def make_endpoints(
    models: list[str], run_dir: Path, tcp: bool, bind_host: str = "127.0.0.1", remote: dict | None = None
) -> Endpoints:
    """ipc:// files in run_dir, or tcp:// on free ports of bind_host; a remote model's is tcp://HOST:PORT."""
    remote = remote or {}
    if not tcp:
        return Endpoints.ipc(models, str(run_dir))
    local = [x for x in models if x not in remote]
    try:
        ports = _free_ports(2 + len(local), bind_host)
    except OSError as e:
        raise LaunchError(f"--bind-host {bind_host}: cannot bind there: {e.strerror or e}") from None
    subservers = {x: tcp_url(bind_host, p) for x, p in zip(local, ports[2:], strict=True)}
    subservers.update({x: f"tcp://{remote[x]}" for x in models if x in remote})
    return Endpoints(
        launcher=tcp_url(bind_host, ports[0]),
        frontend=tcp_url(bind_host, ports[1]),
        subservers={x: subservers[x] for x in models},
        key=new_key(),  # CURVE: only the deployment's own processes are heard (ipc.secure_context)
    )


def _free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    socks = []
    host = host.strip("[]")
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
