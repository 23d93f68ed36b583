"""The `tokenrouter` command line.

Each command is a thin wrapper: it parses arguments, calls into the package, prints, and maps user
mistakes to exit status 1 (errors in the input) or 2 (bad usage). Heavy imports (torch, the runtime)
happen inside the commands so that `tokenrouter check` starts fast.
"""

from __future__ import annotations

import typer

from tokenrouter.cli_help import App
from tokenrouter.outfile import finite_json

app = App(
    name="tokenrouter",
    help="Token-level LLM routing: check, compile and serve .tr policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from tokenrouter import __version__

        typer.echo(f"tokenrouter {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    """Token-level LLM routing: check, compile and serve .tr policies."""


# --- language commands ---


def _name_values(values: list[str] | None, flag: str, shape: str, valid=lambda value: True) -> dict[str, str]:
    """`FLAG NAME=VALUE` options as a dict (names stripped, values as given); one without `=`, without a
    name or whose value fails `valid` is a usage error (exit 2) that shows the expected `shape`."""
    out: dict[str, str] = {}
    for item in values or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not valid(value):
            typer.echo(f"error: bad {flag} '{item}': expected {shape}", err=True)
            raise typer.Exit(2)
        out[name.strip()] = value
    return out


def _defines(values: list[str] | None) -> dict[str, str]:
    """`-D NAME=VALUE` options as a dict; a malformed one is a usage error (exit 2)."""
    return _name_values(values, "-D", "NAME=VALUE")


def _require_files(paths: list[str]) -> None:
    """Exit 2 naming the first path that is not a regular file, and why (`compiler.paths.file_problem`)."""
    from tokenrouter.compiler.paths import files_problem

    if problem := files_problem(paths):
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)


@app.command()
def check(
    files: list[str] = typer.Argument(..., help="Policy files (.tr)."),
    define: list[str] = typer.Option(None, "-D", "--define", help="Override a param: NAME=VALUE."),
    max_errors: int = typer.Option(50, min=1, help="Show at most this many diagnostics per file."),
    no_weights_check: bool = typer.Option(
        False,
        "--no-weights-check",
        help="For a machine without the weights: a model folder or router file that is not here is a warning, "
        "not an error (`serve` needs them).",
    ),
) -> None:
    """Check policies: report every error (and warning) in each file. Exit 1 when any has errors."""
    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.dsl.diagnostics import render_all

    defines = _defines(define)
    _require_files(files)
    failed = False
    for path in files:
        result = compile_file(path, defines, weights_check=not no_weights_check)
        if result.diagnostics:
            typer.echo(render_all(result.diagnostics, limit=max_errors), err=True)
        n_err, n_warn = len(result.errors), len(result.diagnostics) - len(result.errors)
        if n_err:
            failed = True
            counts = f"{n_err} error{'s' * (n_err != 1)}, {n_warn} warning{'s' * (n_warn != 1)}"
            typer.echo(f"{path}: {counts}", err=True)
        else:
            typer.echo(f"{path}: ok" + (f" ({n_warn} warning{'s' * (n_warn != 1)})" if n_warn else ""))
    if failed:
        raise typer.Exit(1)


@app.command(name="compile")
def compile_(
    file: str = typer.Argument(..., help="Policy file (.tr)."),
    output: str = typer.Option(
        None, "-o", "--output", help="Plan file to write (default: FILE.plan beside FILE)."
    ),
    define: list[str] = typer.Option(None, "-D", "--define", help="Override a param: NAME=VALUE."),
    no_weights_check: bool = typer.Option(
        False,
        "--no-weights-check",
        help="For a machine without the weights: a model folder or router file that is not here is a warning, "
        "not an error (`serve` needs them).",
    ),
) -> None:
    """Compile a policy to a plan (JSON: the route IR and settings, no code)."""
    from pathlib import Path

    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.compiler.plan import PlanError, write_plan
    from tokenrouter.dsl.diagnostics import render_all

    defines = _defines(define)
    _require_files([file])
    result = compile_file(file, defines, weights_check=not no_weights_check)
    if result.diagnostics:
        typer.echo(render_all(result.diagnostics), err=True)
    if result.plan is None:
        n = len(result.errors)
        typer.echo(f"{file}: not compiled ({n} error{'s' * (n != 1)})", err=True)
        raise typer.Exit(1)
    out = Path(output) if output else Path(file).with_suffix(".plan")
    try:
        write_plan(result.plan, out, inputs=[file])
    except (OSError, PlanError) as exc:
        typer.echo(f"error: cannot write {out}: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {out}")


@app.command()
def fmt(
    files: list[str] = typer.Argument(..., help="Policy files (.tr) to format in place."),
    check_only: bool = typer.Option(False, "--check", help="Change nothing; exit 1 if a file would change."),
) -> None:
    """Format policies canonically (in place), or with --check report which would change."""
    from pathlib import Path

    from tokenrouter.dsl.diagnostics import render_all
    from tokenrouter.dsl.formatter import format_module
    from tokenrouter.dsl.parser import parse

    _require_files(files)
    status = 0
    for path in files:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            typer.echo(f"{path}: error: cannot read file: {exc}", err=True)
            status = 1
            continue
        result = parse(text, path)
        if result.module is None:
            typer.echo(render_all(result.diagnostics), err=True)
            status = 1
            continue
        formatted = format_module(result.module)
        if formatted == text:
            continue
        if check_only:
            typer.echo(f"{path}: would reformat")
            status = 1
        else:
            Path(path).write_text(formatted, encoding="utf-8")
            typer.echo(f"reformatted {path}")
    if status:
        raise typer.Exit(status)


@app.command()
def inspect(
    plan_file: str = typer.Argument(
        ..., metavar="PLAN", help="A plan written by `tokenrouter compile`, or a policy (.tr) compiled now."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the validated plan as JSON (paths absolute)."),
    kernels: bool = typer.Option(
        False, "--kernels", help="Print each model's route kernel as rendered from the IR."
    ),
    sampler: str | None = typer.Option(
        None,
        "--sampler",
        help="With --kernels: the sampler rendered, strided (default, measured faster) or cdf (docs/ir.md).",
        show_default=False,
    ),
) -> None:
    """Summarize a plan: models, entry, rules in source form, features per model, thresholds, feasibility."""
    import json

    from tokenrouter.compiler.driver import load_plan
    from tokenrouter.compiler.plan import PlanError
    from tokenrouter.compiler.summary import render

    _require_files([plan_file])
    try:
        # what the plan says, whether or not its weights are on this machine
        plan = load_plan(plan_file, weights_check=False)
    except PlanError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if kernels:
        _print_kernels(plan, sampler)
    elif as_json:
        typer.echo(json.dumps(plan, indent=2, ensure_ascii=False))
    else:
        typer.echo(render(plan))


# --- route kernel commands ---


def _print_kernels(plan: dict, sampler: str | None = None) -> None:
    """`inspect --kernels`: the torch and Triton source rendered from each model's route IR (`sampler`:
    None = the default one)."""
    from tokenrouter.compiler.kernels import BACKENDS, DEFAULT_SAMPLER, RouteIRError, render_route_kernel

    sampler = DEFAULT_SAMPLER if sampler is None else sampler
    for model, ir in plan["routes"].items():
        for backend in BACKENDS:
            try:
                source = render_route_kernel(ir, backend, model, sampler=sampler)
            except (RouteIRError, ValueError) as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from None
            typer.echo(f"# ===== model {model}: {backend} route kernel =====")
            typer.echo(source)


@app.command()
def download(
    plan_file: str = typer.Argument(..., help="Plan file or policy (.tr)."),
    define: list[str] = typer.Option(None, "-D", "--define", help="Override a param: NAME=VALUE."),
) -> None:
    """Fetch every model of a policy given as a hub id into the local hub cache, ahead of `serve`."""
    from tokenrouter.compiler.driver import load_plan
    from tokenrouter.compiler.plan import PlanError
    from tokenrouter.hub import download_plan

    _require_files([plan_file])
    try:
        plan = load_plan(plan_file, _defines(define))
    except PlanError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if download_plan(plan, lambda line: typer.echo(line, err=line.startswith("error:"))):
        raise typer.Exit(1)


@app.command(name="init-router")
def init_router(
    plan_file: str = typer.Argument(..., metavar="PLAN", help="A plan (or a .tr policy, compiled first)."),
    router: str = typer.Argument(..., metavar="ROUTER_NAME", help="The router's name in the policy."),
    output: str = typer.Option(None, "-o", "--output", help="File to write (default: the router's path)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random initial weights."),
    hidden_layers: str = typer.Option(
        "256", "--hidden-layers", help="mlp only: hidden layer sizes, e.g. 256,128."
    ),
    hidden_size: int = typer.Option(
        None, "--hidden-size", help="Override the model's hidden_size (config.json)."
    ),
    force: bool = typer.Option(
        False, "--force", help="Overwrite the file if there is one (a trained router too)."
    ),
) -> None:
    """Write an untrained router file of the right shape (layout: docs/routers.md)."""
    from pathlib import Path

    from tokenrouter.compiler.driver import load_plan
    from tokenrouter.compiler.plan import PlanError
    from tokenrouter.runtime.route.routers import init_router_file, parse_hidden_layers
    from tokenrouter.training.router_train import router_size_problem
    from tokenrouter.training.settings import output_problem

    _require_files([plan_file])
    try:
        layers = parse_hidden_layers(hidden_layers)
    except ValueError as exc:
        typer.echo(f"error: --hidden-layers: {exc}", err=True)
        raise typer.Exit(2) from None
    if hidden_size is not None and hidden_size < 1:
        typer.echo("error: --hidden-size must be >= 1", err=True)
        raise typer.Exit(2)
    try:
        plan = load_plan(plan_file, weights_check=False)  # the router file is what it writes
        what = "-o" if output is not None else f"the path of router {router!r}"
        if output is None:
            output = (plan.get("routers") or {}).get(router, {}).get("path")
        # before the weights are drawn: a folder at the path, or too many weights for memory
        if output is not None and (problem := output_problem(Path(output), what)):
            raise ValueError(problem)
        if output is not None and Path(output).exists() and not force:
            typer.echo(f"error: {output} exists (a trained router, perhaps); --force overwrites it", err=True)
            raise typer.Exit(2)
        if problem := router_size_problem(plan, router, layers, hidden_size):
            typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(2)
        spec, width = init_router_file(
            plan, router, output, seed=seed, hidden_layers=layers, hidden_size=hidden_size
        )
    except (PlanError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"error: cannot write {output}: {exc}", err=True)
        raise typer.Exit(1) from None
    shape = f"[1, {width}]" if spec.kind == "linear" else " -> ".join(str(n) for n in (width, *layers, 1))
    typer.echo(
        f"wrote {output}: untrained {spec.kind} router {router!r}, D = {width} ({spec.inputs_text()}), {shape}"
    )


# --- serving commands ---


@app.command()
def serve(
    plan: str = typer.Argument(..., help="A plan (.plan, JSON) or a policy (.tr, compiled on the fly)."),
    define: list[str] = typer.Option(
        None, "-D", "--define", help="With a .tr policy: override a param, as compile's -D: NAME=VALUE."
    ),
    host: str = typer.Option("127.0.0.1", help="Address the HTTP server listens on."),
    port: int = typer.Option(8000, help="HTTP port (0: any free port; the printed URL has it)."),
    api_key: str = typer.Option(
        None, envvar="TOKENROUTER_API_KEY", help="Require 'Authorization: Bearer KEY'."
    ),
    tcp: bool = typer.Option(
        False, "--tcp", help="ZeroMQ over tcp:// (on --bind-host) instead of ipc:// files."
    ),
    bind_host: str = typer.Option(
        "127.0.0.1", help="With --tcp: this host's address for ZeroMQ (remote subservers connect to it)."
    ),
    remote: list[str] = typer.Option(
        None,
        help="MODEL=HOST:PORT: that model's subserver runs on another host (started with the printed "
        "`tokenrouter subserver` command). Repeatable; needs --tcp.",
    ),  # fmt: skip
    heartbeat_timeout: float = typer.Option(
        10.0, help="Seconds without a remote subserver's stats before it counts as failed."
    ),
    liveness_timeout: float = typer.Option(
        60.0,
        help="Seconds without a local subserver's stats (sent every 0.5 s between steps) before it counts as "
        "failed: frozen, or stuck in one step. The deployment then shuts down as for a dead process.",
    ),
    device: str = typer.Option(None, help="cpu or cuda (default: the plan's placement; CPU without CUDA)."),
    startup_timeout: float = typer.Option(600.0, help="Seconds to wait for every process to be ready."),
    max_body_mib: float = typer.Option(
        16.0, help="A request body longer than this many MiB gets a 413 before it is read."
    ),
    body_timeout: float = typer.Option(
        30.0, help="Seconds a request body may take to arrive in full; a slower one gets a 408."
    ),
    profile_dir: str = typer.Option(
        None,
        help="Allow POST /start_profile and /stop_profile: each subserver's steps under torch.profiler, written "
        "here as a Chrome trace and a table of ops (made if missing).",
    ),
    log_level: str = typer.Option(
        "warning", help="Log level of all processes (debug, info, warning, error)."
    ),
    mode: str = typer.Option(
        "tokenrouter",
        help="tokenrouter, or a baseline: llm-only, lockstep, std-serving, eager, no-graphs (docs/architecture.md).",
    ),
    llm: str = typer.Option(
        None, help="--mode llm-only: the model to serve (default: the one with the most parameters)."
    ),
    mps: str = typer.Option(
        "auto",
        help="CUDA MPS for subservers sharing a GPU: auto (when two share one and MPS is installed), on, off.",
    ),
    mps_sm: list[str] = typer.Option(
        None,
        help="MODEL=PCT: cap that model's kernels at PCT % of the GPU's SMs (MPS active thread percentage), "
        "so a large model cannot hold every SM while a small one waits. Repeatable.",
    ),
    mps_low: list[str] = typer.Option(
        None,
        help="MODEL: run that model's kernels at MPS's below-normal client priority (CUDA_MPS_CLIENT_PRIORITY=1), "
        "so the other models' ready kernels are dispatched first. Repeatable.",
    ),
    batch: list[str] = typer.Option(
        None,
        help="MODEL=B: serve that model at delayed-batching threshold B instead of the plan's (modes tokenrouter "
        "and no-graphs; e.g. to profile a second threshold for `profile --colocation`). Repeatable.",
    ),
    cpu_threads: int = typer.Option(
        None,
        help="Torch CPU threads per subserver (default: the usable cores divided among the plan's models; "
        "more oversubscribes the cores and slows every parallel CPU op many times).",
    ),
    prefix_cache: bool = typer.Option(
        True,
        "--prefix-cache/--no-prefix-cache",
        help="Share KV across requests with a common prefix (every mode; the SGLang engine has none either way). "
        "See docs/serving.md, 'Prefix cache'.",
    ),
) -> None:
    """Serve a plan: one subserver per model and an OpenAI-compatible HTTP API (see docs/serving.md)."""
    import math
    import os

    from tokenrouter.runtime.launcher import ServeConfig
    from tokenrouter.runtime.launcher import serve as run_serve

    if not os.path.isfile(plan):
        typer.echo(f"error: no such plan: {plan}", err=True)
        raise typer.Exit(2)
    for flag, seconds in (("--startup-timeout", startup_timeout), ("--heartbeat-timeout", heartbeat_timeout)):
        if not (math.isfinite(seconds) and seconds > 0):
            typer.echo(f"error: {flag} must be a finite number of seconds > 0, got {seconds}", err=True)
            raise typer.Exit(2)
    remotes = {
        name: addr.strip()
        for name, addr in _name_values(
            remote, "--remote", "MODEL=HOST:PORT", lambda v: bool(v.strip())
        ).items()
    }
    sm_caps = {
        name: int(pct)
        for name, pct in _name_values(
            mps_sm, "--mps-sm", "MODEL=PERCENT", lambda v: v.strip().isdigit()
        ).items()
    }
    thresholds = {
        name: int(b)
        for name, b in _name_values(batch, "--batch", "MODEL=B", lambda v: v.strip().isdigit()).items()
    }
    defines = _defines(define)
    try:
        cfg = ServeConfig(plan=plan, host=host, port=port, api_key=api_key, tcp=tcp, device=device,
                          startup_timeout_s=startup_timeout, log_level=log_level, mode=mode, llm=llm,
                          bind_host=bind_host, remote=remotes, heartbeat_timeout_s=heartbeat_timeout,
                          liveness_timeout_s=liveness_timeout,
                          mps=mps, mps_sm=sm_caps, mps_low=list(mps_low or []), batch=thresholds,
                          cpu_threads=cpu_threads, max_body_mib=max_body_mib, body_timeout_s=body_timeout,
                          profile_dir=profile_dir, prefix_cache=prefix_cache, defines=defines)  # fmt: skip
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(run_serve(cfg))


@app.command("subserver")
def subserver_cmd(
    plan: str = typer.Argument(
        ..., help="The plan (.plan) or policy (.tr) that `serve` runs, copied to this host."
    ),
    model: str = typer.Option(..., "--model", help="The model of the plan this subserver runs."),
    endpoints: str = typer.Option(
        ..., "--endpoints", help="The endpoints JSON that `serve --remote` prints (or a file holding it)."
    ),
    device: str = typer.Option(None, help="cpu, cuda or cuda:N (default: the plan's placement)."),
    log_level: str = typer.Option("warning", help="Log level (debug, info, warning, error)."),
    cpu_threads: int = typer.Option(
        None, help="Torch CPU threads (default: this host's usable cores divided among the plan's models)."
    ),
    prefix_cache: bool = typer.Option(
        True, "--prefix-cache/--no-prefix-cache", help="As `serve` has it (its printed command says)."
    ),
) -> None:
    """Run one model's subserver in the foreground, for `serve --remote` (docs/serving.md, "Subservers on
    other hosts"). Exits 0 on the launcher's Shutdown or SIGINT/SIGTERM, 1 on a failure."""
    import json
    import os
    import tempfile
    from pathlib import Path

    from tokenrouter.runtime.ipc import Endpoints
    from tokenrouter.runtime.launcher import LaunchError, load_plan
    from tokenrouter.runtime.subserver.process import SubserverArgs, run_subserver_process

    try:
        eps = Endpoints.parse(endpoints)
    except ValueError as exc:
        message, kind = str(exc), None
        try:  # JSON of another shape is no file name: say which shape it must have
            if not os.path.exists(endpoints):
                other = json.loads(endpoints)
                kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
                kind = None if isinstance(other, dict) else kinds.get(type(other), "a number")
        except ValueError:
            pass
        if kind is not None:
            message = (f'--endpoints: expected a JSON object {{"launcher": URL, "frontend": URL, "subservers": '
                       f"{{MODEL: URL}}}} (the JSON that `tokenrouter serve` prints), got {kind}")  # fmt: skip
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(2) from None
    if device is not None and device != "cpu" and not device.startswith("cuda"):
        typer.echo(f"error: --device must be cpu, cuda or cuda:N, got {device!r}", err=True)
        raise typer.Exit(2)
    with tempfile.TemporaryDirectory(prefix="tokenrouter-subserver-") as tmp:
        try:
            spec, plan_path = load_plan(plan, Path(tmp))
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
        except LaunchError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        if device == "cuda":
            device = f"cuda:{(spec['models'][model].get('gpus') or [0])[0]}"
        try:
            args = SubserverArgs(plan_path=plan_path, model=model, endpoints=eps.to_dict(), device=device,
                                 log_level=log_level.upper(), cpu_threads=cpu_threads,
                                 extra={"prefix_cache": prefix_cache})  # fmt: skip
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"tokenrouter: subserver {model!r} on {eps.subservers[model]}", err=True)
        try:
            run_subserver_process(args)
        except SystemExit as exc:
            typer.echo(f"error: subserver {model!r} failed (see the log above)", err=True)
            raise typer.Exit(1) from exc
        typer.echo(f"tokenrouter: subserver {model!r} stopped", err=True)


# --- benchmark commands ---


@app.command()
def bench(
    url: str = typer.Option(
        "http://127.0.0.1:8000", help="Base URL of an OpenAI-compatible server (a trailing /v1 is taken off)."
    ),
    concurrency: int = typer.Option(
        None,
        "--concurrency",
        "-c",
        help="Requests in flight: a closed loop's workers (default 4); with --request-rate, the most at once "
        "(default: no cap).",
    ),
    request_rate: float = typer.Option(
        None,
        help="Requests per second, arriving on their own clock (an open loop) instead of a closed loop.",
    ),
    burstiness: float = typer.Option(
        1.0,
        help="With --request-rate: the gamma shape of the gaps between arrivals (1: Poisson, < 1 burstier).",
    ),
    warmup: int = typer.Option(0, help="Requests sent first, at the load's concurrency, and not counted."),
    slo_ttft_ms: float = typer.Option(
        None, help="A request meets the SLO only with a TTFT within this; the report adds the goodput."
    ),
    slo_tpot_ms: float = typer.Option(
        None, help="A request meets the SLO only with a TPOT within this; the report adds the goodput."
    ),
    num_prompts: int = typer.Option(32, "--num-prompts", "-n", help="Requests to send in all."),
    output_len: int = typer.Option(
        128, help="Tokens to generate per request (max_tokens); a .jsonl line's output_len overrides it."
    ),
    prompt_len: int = typer.Option(32, help="Length of synthetic token-id prompts."),
    prompts_file: str = typer.Option(
        None,
        help="Prompts instead of synthetic ones: a text file, one prompt a line, or a .jsonl file of "
        '{"prompt": TEXT or [TOKEN IDS], "output_len": N (optional)} lines.',
    ),
    ignore_eos: bool = typer.Option(True, help="Ask the server to ignore EOS (fixed output length)."),
    temperature: float = typer.Option(0.0),
    seed: int = typer.Option(0),
    model: str = typer.Option(None, help="Model id (default: the first one /v1/models lists)."),
    api_key: str = typer.Option(None, envvar="TOKENROUTER_API_KEY"),
    json_out: str = typer.Option(None, "--json", help="Also write the report as JSON to this file."),
    progress: bool = typer.Option(True, help="Show a progress bar on stderr."),
    shared_prefix_len: int = typer.Option(
        0,
        help="Shared-prefix load: each synthetic prompt starts with its group's prefix of this many tokens.",
    ),
    prefix_groups: int = typer.Option(
        1, help="With --shared-prefix-len: request i uses group i mod G's prefix."
    ),
    turns: int = typer.Option(
        0,
        help="Multi-turn chat: --num-prompts conversations of this many turns, --concurrency at once; each turn "
        "re-sends the conversation so far plus a user message of --prompt-len tokens (docs/serving.md).",
    ),
    system_len: int = typer.Option(
        0, help="With --turns: a system prompt of this many tokens, shared by all."
    ),
    think_time: float = typer.Option(
        0.0, help="With --turns: seconds between a turn's answer and the next turn."
    ),
) -> None:
    """Load-test a running server: decode throughput, TTFT, TPOT, latency percentiles, tokens per model."""
    import asyncio
    import math

    from tokenrouter.loadgen.bench import (
        LoadRefused,
        LoadSpec,
        format_report,
        make_requests,
        run_load,
        write_report,
    )
    from tokenrouter.outfile import check_output

    try:
        spec = LoadSpec(
            url=url,
            model=model,
            concurrency=concurrency if concurrency is not None or request_rate is not None else 4,
            request_rate=math.inf if request_rate is None else request_rate,
            burstiness=burstiness,
            warmup=warmup,
            slo_ttft_ms=slo_ttft_ms,
            slo_tpot_ms=slo_tpot_ms,
            num_prompts=num_prompts,
            output_len=output_len,
            prompt_len=prompt_len,
            prompts_file=prompts_file,
            ignore_eos=ignore_eos,
            temperature=temperature,
            seed=seed,
            api_key=api_key,
            progress=progress,
            shared_prefix_len=shared_prefix_len,
            prefix_groups=prefix_groups,
            turns=turns,
            system_len=system_len,
            think_time_s=think_time,
        )
        make_requests(spec)  # a prompts file's bad line is a usage error, before anything is sent
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        try:  # before the run, which a report that cannot be written would lose
            check_output(json_out)
        except OSError as exc:
            typer.echo(f"error: cannot write --json {json_out}: {exc}", err=True)
            raise typer.Exit(2) from None
    try:
        report = asyncio.run(run_load(spec))
    except LoadRefused as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except Exception as exc:  # connection refused, bad URL: a user-facing condition, not a bug
        typer.echo(f"error: could not benchmark {spec.url}: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(format_report(report))
    if json_out:
        try:
            write_report(report, json_out)
        except OSError as exc:
            typer.echo(f"error: cannot write --json {json_out}: {exc}", err=True)
            raise typer.Exit(1) from None
    if report["failed"]:
        raise typer.Exit(1)


# --- engine commands ---


@app.command(name="make-model")
def make_model_cmd(
    out_dir: str = typer.Argument(..., help="Folder to write (created; must be empty unless --force)."),
    shape: str = typer.Option("tiny", help="tiny | qwen3-0.6b | qwen3-1.7b | qwen3-8b | qwen3-32b."),
    seed: int = typer.Option(0, help="Seed of the random weights."),
    arch: str = typer.Option(None, help="Override the family: qwen3 | qwen2 | llama."),
    hidden: int = typer.Option(None, help="Override hidden_size."),
    intermediate: int = typer.Option(None, help="Override intermediate_size."),
    layers: int = typer.Option(None, help="Override num_hidden_layers."),
    heads: int = typer.Option(None, help="Override num_attention_heads."),
    kv_heads: int = typer.Option(None, help="Override num_key_value_heads."),
    head_dim: int = typer.Option(None, help="Override head_dim."),
    vocab: int = typer.Option(None, help="Override vocab_size (>= 512, the tokenizer's size)."),
    tie: bool = typer.Option(None, "--tie/--no-tie", help="Tie the lm_head to the embedding."),
    weights: bool = typer.Option(
        None, "--weights/--no-weights", help="Write model.safetensors (default: small shapes only)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite a non-empty folder."),
) -> None:
    """Write a random-weight HF-format model folder (config, tokenizer, and for small shapes weights)."""
    from tokenrouter.runtime.engine.config import load_model_config
    from tokenrouter.runtime.engine.make_model import make_model, shape_for

    try:
        spec = shape_for(shape, arch=arch, hidden=hidden, intermediate=intermediate, layers=layers, heads=heads,
                         kv_heads=kv_heads, head_dim=head_dim, vocab=vocab, tie=tie)  # fmt: skip
    except (ValueError, TypeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        out = make_model(out_dir, spec, seed=seed, weights=weights, force=force)
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    config = load_model_config(out)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    what = ", ".join(files) if files else "no weights (load with load='dummy')"
    typer.echo(f"wrote {out}: {config.architecture}, {config.num_params() / 1e6:.2f}M parameters, {what}")


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        typer.echo(f"error: --prompt-ids must be comma-separated ints, got {text!r}", err=True)
        raise typer.Exit(2) from None
    if not ids:
        typer.echo("error: --prompt-ids is empty", err=True)
        raise typer.Exit(2)
    return ids


@app.command()
def generate(
    path: str = typer.Argument(
        ..., help="A model folder (HF format), or a plan (.plan) / policy (.tr) to run with its routing."
    ),
    prompt: str = typer.Option(None, help="Prompt text (tokenized with the folder's tokenizer)."),
    prompt_ids: str = typer.Option(None, help="Prompt token ids, e.g. 1,2,3."),
    max_tokens: int = typer.Option(32, help="Tokens to generate at most."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_k: int = typer.Option(0, help="0 = off."),
    top_p: float = typer.Option(1.0, help="1.0 = off."),
    seed: int = typer.Option(0, help="Sampling seed."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Do not stop at EOS."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    dtype: str = typer.Option(
        None, help="bfloat16 | float16 | float32 (default: float32 on CPU, bfloat16 on CUDA)."
    ),
    load: str = typer.Option("auto", help="auto (safetensors) or dummy (random weights)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON with token_ids instead of text."),
    trace: bool = typer.Option(False, "--trace", help="Plan/policy only: show which model wrote each token."),
    define: list[str] = typer.Option(
        None, "-D", "--define", help="Policy (.tr) only: override a param NAME=VALUE."
    ),
    chat: bool = typer.Option(False, "--chat", help="Model folder only: wrap --prompt in its chat template."),
) -> None:
    """Generate from one prompt in-process with the embedded engine (a plan: every model, with routing)."""
    import json
    import os

    if not os.path.exists(path):
        typer.echo(f"error: no such model folder, plan or policy: {path}", err=True)
        raise typer.Exit(2)
    is_plan = not os.path.isdir(path)
    if is_plan and not path.endswith((".plan", ".tr")):
        typer.echo(f"error: {path}: not a model folder, a plan (.plan) or a policy (.tr)", err=True)
        raise typer.Exit(2)
    if not is_plan and (trace or define):
        typer.echo("error: --trace and -D apply to a plan or policy, not a model folder", err=True)
        raise typer.Exit(2)
    if (prompt is None) == (prompt_ids is None):
        typer.echo("error: give exactly one of --prompt or --prompt-ids", err=True)
        raise typer.Exit(2)
    ids = _parse_ids(prompt_ids) if prompt_ids is not None else None
    if is_plan:
        if dtype is not None or load != "auto":
            typer.echo("error: --dtype and --load come from the plan's model options for a plan", err=True)
            raise typer.Exit(2)
        if chat:
            typer.echo("error: --chat applies to a model folder (not supported for plans yet)", err=True)
            raise typer.Exit(2)
        _generate_plan(path, prompt, ids, max_tokens, temperature, top_k, top_p, seed, ignore_eos, device,
                       json_out, trace, _defines(define))  # fmt: skip
        return

    from tokenrouter.runtime.engine.base import EngineError
    from tokenrouter.runtime.engine.generate import generate_from_folder
    from tokenrouter.runtime.sampling import SamplingParams

    if chat and prompt is None:
        typer.echo("error: --chat needs --prompt (a chat template applies to text)", err=True)
        raise typer.Exit(2)

    try:
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                max_tokens=max_tokens, ignore_eos=ignore_eos)  # fmt: skip
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        result = generate_from_folder(path, prompt=prompt, prompt_ids=ids, params=params, device=device,
                                      dtype=dtype, load=load, chat=chat)  # fmt: skip
    except (EngineError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if json_out:
        typer.echo(json.dumps(finite_json(result)))
    else:
        typer.echo(result["text"] if result["text"] is not None else ",".join(map(str, result["token_ids"])))


# --- subserver commands ---


def _generate_plan(path: str, prompt: str | None, ids: list[int] | None, max_tokens: int, temperature: float,
                   top_k: int, top_p: float, seed: int, ignore_eos: bool, device: str, json_out: bool,
                   trace: bool, defines: dict[str, str]) -> None:  # fmt: skip
    """`generate PLAN|POLICY`: every model of the plan in this process (runtime/offline.py)."""
    import json

    from tokenrouter.runtime.engine.base import EngineError
    from tokenrouter.runtime.messages import SamplingSpec
    from tokenrouter.runtime.offline import PlanInputError, generate_from_plan
    from tokenrouter.runtime.sampling import SamplingParams

    if defines and not path.endswith(".tr"):
        typer.echo("error: -D applies to a .tr policy; a plan's params are already bound", err=True)
        raise typer.Exit(2)
    try:  # the same validation as a model folder's generate
        SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, max_tokens=max_tokens)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    spec = SamplingSpec(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, max_tokens=max_tokens,
                        ignore_eos=ignore_eos)  # fmt: skip
    try:
        out = generate_from_plan(path, prompt=prompt, prompt_ids=ids, sampling=spec,
                                 device=None if device == "cuda" else device, defines=defines)  # fmt: skip
    except PlanInputError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    except (EngineError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if json_out:
        typer.echo(json.dumps(finite_json(out)))
        return
    typer.echo(out["text"] if out["text"] is not None else ",".join(map(str, out["token_ids"])))
    if trace:
        pieces = out["pieces"] or [""] * len(out["token_ids"])
        for i, (tok, model, piece) in enumerate(zip(out["token_ids"], out["models"], pieces, strict=True)):
            typer.echo(f"{i:4d}  {model:<12} {tok:>7}  {piece!r}")
        per_model = ", ".join(f"{k} {v}" for k, v in out["tokens_per_model"].items())
        typer.echo(f"tokens: {per_model}; hops: {len(out['hops'])}; finish: {out['finish_reason']}")


@app.command()
def trace(
    file: str = typer.Argument(
        ...,
        help="A response JSON (or its routing), `generate --json`/`--trace` output, or a `bench --json` report.",
    ),
    output: str = typer.Option(None, "-o", "--output", help="The standalone HTML file to write."),
    png: str = typer.Option(None, "--png", help="Also draw it as this PNG (needs matplotlib)."),
) -> None:
    """A saved routing trace as a picture: tokens coloured by the model that wrote them, hops, shares."""
    from tokenrouter.trace_view import TraceFormatError, TraceUsageError, command

    try:
        typer.echo("\n".join(command(file, output, png)))
    except TraceUsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except TraceFormatError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"error: cannot write: {exc}", err=True)
        raise typer.Exit(1) from None


# --- training and quality commands ---


def _teacher_settings(max_tokens: int, seq_len: int, prompt: int):
    from tokenrouter.training.teacher import TeacherConfig

    try:
        return TeacherConfig(seq_len=seq_len, prompt=prompt, max_tokens=max_tokens)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command(name="train-router")
def train_router_cmd(
    plan_file: str = typer.Argument(..., metavar="PLAN", help="A policy (.tr) or a compiled plan."),
    router: str = typer.Argument(..., metavar="ROUTER", help="The router's name in the policy."),
    data: str = typer.Option(
        ..., "--data", help="A folder of text files (held out from the models' training)."
    ),
    output: str = typer.Option(
        None, "-o", "--output", help="The safetensors file (default: the router's path)."
    ),
    define: list[str] = typer.Option(None, "-D", "--define", help="Override a param: NAME=VALUE (.tr only)."),
    max_tokens: int = typer.Option(30_000, help="Teacher-forced positions to label at most."),
    seq_len: int = typer.Option(256, help="Tokens per window of text."),
    prompt: int = typer.Option(16, help="Leading tokens of each window used as context only."),
    hidden_layers: str = typer.Option(
        "256", "--hidden-layers", help="mlp only: hidden layer sizes, e.g. 256,128."
    ),
    epochs: int = typer.Option(30, help="Training epochs (the best held-out epoch is kept)."),
    seed: int = typer.Option(0, help="Seed of the split, the initial weights and the batches."),
    label: str = typer.Option(
        "divergence",
        help="divergence (small greedy != large greedy), gain, nll-gain, expected-gain or top-share "
        "(docs/quality.md).",
    ),
    top_share: float = typer.Option(0.25, help="top-share label: the share of training rows labelled 1."),
    loss: str = typer.Option("auto", help="auto (BCE or mean squared error by label) or pairwise (ranking)."),
    ensemble: int = typer.Option(1, help="Train N routers (seeds differ) and write their average as one."),
    lr: float = typer.Option(2e-3, help="AdamW learning rate."),
    cache: str = typer.Option(
        None, "--cache", help="Keep the teacher-forced rows in this folder and reuse them (e.g. .data/cache)."
    ),
) -> None:
    """Train a router on teacher-forced labels; print precision/recall and the held-out sweep."""
    from pathlib import Path

    from tokenrouter.runtime.route.routers import parse_hidden_layers
    from tokenrouter.training.policy_view import PolicyViewError, load_plan
    from tokenrouter.training.router_train import (
        RouterTrainConfig,
        TrainSettingsError,
        format_report,
        train_router,
    )

    teacher = _teacher_settings(max_tokens, seq_len, prompt)
    try:
        layers = parse_hidden_layers(hidden_layers)
    except ValueError as exc:
        typer.echo(f"error: --hidden-layers: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        cfg = RouterTrainConfig(label=label, loss=loss, top_share=top_share, hidden_layers=layers,
                                epochs=epochs, lr=lr, seed=seed, ensemble=ensemble)  # fmt: skip
    except ValueError as exc:
        typer.echo(f"error: bad training settings: {exc}", err=True)
        raise typer.Exit(2) from None
    try:  # train_router checks its settings and output path before the teacher forcing
        plan = load_plan(plan_file, _defines(define), weights_check=False)  # the router is what it writes
        rep = train_router(plan, router, Path(data), Path(output) if output else None, teacher, cfg,
                           cache=Path(cache) if cache else None)  # fmt: skip
    except TrainSettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except (PolicyViewError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if rep.cache != "off":
        typer.echo(f"teacher-forced rows: cache {rep.cache}")
    typer.echo(
        f"wrote {rep.path}: router {router!r} trained on {rep.rows_train} positions, {rep.rows_val} held out"
    )
    typer.echo(format_report(rep))


@app.command(name="eval")
def eval_cmd(
    plan_file: str = typer.Argument(..., metavar="PLAN", help="A policy (.tr) or a compiled plan."),
    data: str = typer.Option(..., "--data", help="A folder of held-out text files."),
    plot: str = typer.Option(None, "--plot", help="Write the quality/cost chart to this PNG file."),
    json_out: bool = typer.Option(False, "--json", help="Print the full result as JSON instead of a table."),
    define: list[str] = typer.Option(None, "-D", "--define", help="Override a param: NAME=VALUE (.tr only)."),
    param: str = typer.Option("threshold", help="The param to sweep."),
    shares: str = typer.Option("0.05,0.1,0.15,0.2,0.25,0.3,0.4,0.5", help="Target large-model shares."),
    max_tokens: int = typer.Option(20_000, help="Teacher-forced positions to score at most."),
    seq_len: int = typer.Option(256, help="Tokens per window of text."),
    prompt: int = typer.Option(16, help="Leading tokens of each window used as context only."),
    seed: int = typer.Option(0, help="Seed of the window sample and the random baseline."),
    generate_n: int = typer.Option(
        0, "--generate", help="Also complete N held-out function headers (routed vs alone)."
    ),
    max_new: int = typer.Option(48, "--max-new-tokens", help="--generate: tokens per completion."),
    cache: str = typer.Option(
        None, "--cache", help="Keep the teacher-forced rows in this folder and reuse them (e.g. .data/cache)."
    ),
    versus: list[str] = typer.Option(
        None,
        "--versus",
        help="NAME=VALUE on top of -D: compare the policy with these params (e.g. another router_path), paired.",
    ),
) -> None:
    """Teacher-forced quality vs large-model share: the policy's threshold sweep against baselines."""
    import json
    from pathlib import Path

    from tokenrouter.training.evaluate import EvalConfig, evaluate, format_table
    from tokenrouter.training.evaluate import plot as plot_curves
    from tokenrouter.training.gencheck import context_problem
    from tokenrouter.training.policy_view import PolicyViewError, load_plan
    from tokenrouter.training.settings import TrainSettingsError

    teacher = _teacher_settings(max_tokens, seq_len, prompt)
    try:
        values = tuple(float(x) for x in shares.split(",") if x.strip())
    except ValueError:
        typer.echo(f"error: --shares {shares!r}: expected fractions in (0, 1) separated by commas, e.g. 0.1,0.25",
                   err=True)  # fmt: skip
        raise typer.Exit(2) from None
    try:
        cfg = EvalConfig(param=param, shares=values, seed=seed)
    except ValueError as exc:
        typer.echo(f"error: --shares: {exc}", err=True)
        raise typer.Exit(2) from None
    if plot is not None and not plot.endswith(".png"):
        typer.echo("error: --plot takes a .png file name", err=True)
        raise typer.Exit(2)
    if generate_n < 0 or max_new < 1:
        typer.echo("error: --generate must be >= 0 and --max-new-tokens >= 1", err=True)
        raise typer.Exit(2)
    try:
        plan = load_plan(plan_file, _defines(define))
        other = load_plan(plan_file, {**_defines(define), **_defines(versus)}) if versus else None
        # the generated check runs after the evaluation, which checks its own settings (--cache, --seq-len)
        if generate_n and (problem := context_problem(plan, max_new)):
            typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(2)
        result = evaluate(plan, Path(data), teacher, cfg, cache=Path(cache) if cache else None, versus=other)
    except TrainSettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except (PolicyViewError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if generate_n:
        from tokenrouter.runtime.engine.base import EngineError
        from tokenrouter.training.gencheck import format_check, generated_check

        try:
            result["generated"] = generated_check(plan, Path(data), generate_n, max_new, seed)
        except (EngineError, ValueError) as exc:
            typer.echo(f"error: generated check: {exc}", err=True)
            raise typer.Exit(1) from None
    if plot is not None:
        try:
            plot_curves(result, Path(plot))
        except OSError as exc:
            typer.echo(f"error: cannot write {plot}: {exc}", err=True)
            raise typer.Exit(1) from None
    typer.echo(json.dumps(finite_json(result), indent=1) if json_out else format_table(result))
    if generate_n and not json_out:
        typer.echo(format_check(result["generated"]))
    if plot is not None and not json_out:
        typer.echo(f"wrote {plot}")


@app.command()
def calibrate(
    plan_file: str = typer.Argument(..., metavar="PLAN", help="A policy (.tr) or a compiled plan."),
    share: float = typer.Option(
        ..., "--share", help="The share of the tokens the other models should write."
    ),
    param: str = typer.Option("threshold", help="The param to calibrate (one side of one comparison)."),
    define: list[str] = typer.Option(None, "-D", "--define", help="Override a param: NAME=VALUE (.tr only)."),
    prompts_file: str = typer.Option(
        None,
        "--prompts-file",
        help="One prompt a line (text), or a .jsonl file as `bench` reads it (its output_len unused: "
        "--max-tokens); default: synthetic token-id prompts.",
    ),
    num_prompts: int = typer.Option(8, help="Prompts per routed generation."),
    prompt_len: int = typer.Option(32, help="Length of synthetic token-id prompts (as `bench` sends)."),
    max_tokens: int = typer.Option(128, help="Tokens generated per prompt, EOS ignored."),
    iterations: int = typer.Option(8, help="Bisection steps (one routed generation each)."),
    device: str = typer.Option(None, help="Run every model here (default: the plan's placement)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """The param value at which the plan, served greedily in this process, has the models other than the
    entry one write --share of the tokens (docs/serving.md, "Calibrating a threshold")."""
    import json

    from tokenrouter.loadgen.bench import LoadSpec, make_prompts
    from tokenrouter.runtime.engine.base import EngineError
    from tokenrouter.runtime.engine.generate import load_tokenizer
    from tokenrouter.training.calibrate import calibrate_threshold
    from tokenrouter.training.policy_view import PolicyViewError, context_error, load_plan

    if not 0.0 < share < 1.0 or num_prompts < 1 or prompt_len < 1 or max_tokens < 1 or iterations < 1:
        typer.echo("error: --share must be in (0, 1); --num-prompts, --prompt-len, --max-tokens and "
                   "--iterations at least 1", err=True)  # fmt: skip
        raise typer.Exit(2)
    try:
        plan = load_plan(plan_file, _defines(define))
        prompts = make_prompts(
            LoadSpec(num_prompts=num_prompts, prompt_len=prompt_len, prompts_file=prompts_file)
        )
        if prompts_file:
            tok = load_tokenizer(plan["models"][plan["entry"]]["path"])
            prompts = [tok.encode(p).ids if isinstance(p, str) else p for p in prompts]
        longest = max(len(p) for p in prompts)
        asked = (f"the longest prompt of {prompts_file} ({longest} tokens)" if prompts_file
                 else f"--prompt-len {prompt_len}") + f" and --max-tokens {max_tokens}"  # fmt: skip
        # as `bench` checks it, before any work
        if problem := context_error(plan, longest + max_tokens, asked):
            typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(2)
        got = calibrate_threshold(plan, param, share, prompts, max_tokens, device, iterations=iterations)
    except (PolicyViewError, EngineError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if "warning" in got:
        typer.echo(f"warning: {got['warning']}", err=True)
    if json_out:
        typer.echo(json.dumps(finite_json(got)))
        return
    typer.echo(
        f"{param} = {got['threshold']:.6g}: the other models wrote {got['share']:.3f} of "
        f"{num_prompts * max_tokens} tokens (wanted {share:g}); the entry model's solo generations alone "
        f"would give {param} = {got['solo_threshold']:.6g}, served {got['solo_share']:.3f}"
    )


# --- throughput commands ---


def _throughput_call(fn, *args, **kwargs):
    """Run a throughput command body; the user's mistakes become a message and exit 1 (input) or 2 (usage)."""
    from tokenrouter.throughput.plan_inputs import ThroughputInputError, ThroughputUsageError

    try:
        return fn(*args, **kwargs)
    except ThroughputUsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except ThroughputInputError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command()
def tune(
    plan: str = typer.Argument(..., help="Plan file (.plan) or policy source (.tr)."),
    concurrency: int = typer.Option(
        None, "--concurrency", "-n", help="N concurrent requests (default: the plan's)."
    ),
    step_ms: list[str] = typer.Option(
        None, "--step-ms", help="MODEL=MS or MODEL=B:MS,B:MS,… (step latency)."
    ),
    p: list[str] = typer.Option(None, "--p", help="FROM:TO=PROB routing probability per step."),
    delta_ms: float = typer.Option(0.1, "--delta-ms", help="Time step δ of the chain, ms."),
    profile: str = typer.Option(None, "--profile", help="Profile JSON from `tokenrouter profile`."),
    json_out: bool = typer.Option(False, "--json", help="Print the tuning record as JSON."),
    output: str = typer.Option(
        None, "-o", "--output", help="Plan to write (default: the input plan, or FILE.plan)."
    ),
    plot: str = typer.Option(None, "--plot", help="Write a PNG of T(B) over the candidates."),
    top: int = typer.Option(10, "--top", help="Show this many candidates."),
    max_states: int = typer.Option(250_000, "--max-states", help="Skip candidates whose chain is larger."),
    request_tokens: int = typer.Option(
        None,
        "--request-tokens",
        help="Tokens each request of the load commits: prices the profile's prompt prefills per request "
        "(default: as the profile's own load had them); with --request-rate, the length of each request.",
    ),
    request_rate: float = typer.Option(
        None,
        "--request-rate",
        help="Tune for latency at this offered load (requests/s, Poisson, at most -n in flight) by simulating "
        "each candidate's open loop, instead of the chain's closed-loop throughput; needs --request-tokens.",
    ),
    objective: str = typer.Option(
        None,
        "--objective",
        help="With --request-rate: the latency to minimize, e.g. from-arrival-p99 (default), "
        "from-arrival-p50, tpot-p50, ttft-p99, e2e-mean.",
    ),
    max_delay_ms: float = typer.Option(
        None, "--max-delay-ms", help="With --request-rate: the batching timeout (default: the plan's)."
    ),
    hop_ms: list[str] = typer.Option(
        None,
        "--hop-ms",
        help="With --request-rate: MODEL=MS, a hop's transit into MODEL (default instant); `profile`: the "
        "profile's measured delays.",
    ),
    gap_ms: list[str] = typer.Option(
        None,
        "--gap-ms",
        help="MODEL=MS, host time each step of MODEL takes beyond its latency, added to its steps in the chain "
        "(or the simulator, with --request-rate; default none); `profile`: the gaps between back-to-back steps "
        "that the profile measured.",
    ),
    horizon_ms: float = typer.Option(
        None,
        "--horizon-ms",
        help="With --request-rate: simulated time of the final round (default 300000; the "
        "first round simulates a fifth of it).",
    ),
    seeds: int = typer.Option(
        None, "--seeds", help="With --request-rate: seeds of the final round (default 3)."
    ),
    keep: int = typer.Option(
        None, "--keep", help="With --request-rate: candidates in the final round (default 5)."
    ),
    jobs: int = typer.Option(
        None, "--jobs", help="With --request-rate: processes to simulate in (default: the CPUs, up to 8)."
    ),
) -> None:
    """Choose delayed-batching thresholds B* with the DTMC throughput model (or, with --request-rate, for the
    lowest latency at that load in the simulator); write them into the plan."""
    from tokenrouter.throughput.commands import SystemArgs, run_rate_tune, run_tune

    args = SystemArgs(plan, concurrency, step_ms, p, profile, request_tokens)
    rate_only = {"--objective": objective, "--max-delay-ms": max_delay_ms, "--hop-ms": hop_ms,
                 "--horizon-ms": horizon_ms, "--seeds": seeds, "--keep": keep, "--jobs": jobs}  # fmt: skip
    if request_rate is None:
        if given := [flag for flag, value in rate_only.items() if value not in (None, [])]:
            typer.echo(
                f"error: {', '.join(given)} need{'s' if len(given) == 1 else ''} --request-rate (tuning for latency at a load)",
                err=True,
            )
            raise typer.Exit(2)
        text, _ = _throughput_call(
            run_tune, args, delta_ms, output, json_out, plot, top, max_states, gap_ms=gap_ms
        )
    else:
        if plot:
            typer.echo("error: --plot charts the chain's T(B); it does not go with --request-rate", err=True)
            raise typer.Exit(2)
        rate = {"rate_per_s": request_rate, "objective": objective or "from-arrival-p99",
                "max_delay_ms": max_delay_ms, "hop_ms": hop_ms, "gap_ms": gap_ms, "horizon_ms": horizon_ms or 300_000.0,
                "screen_ms": (horizon_ms or 300_000.0) / 5, "seeds": 3 if seeds is None else seeds,
                "keep": 5 if keep is None else keep, "jobs": jobs}  # fmt: skip
        text, _ = _throughput_call(run_rate_tune, args, rate, output, json_out, top)
    typer.echo(text)


@app.command()
def simulate(
    plan: str = typer.Argument(..., help="Plan file (.plan) or policy source (.tr)."),
    concurrency: int = typer.Option(
        None, "--concurrency", "-n", help="N concurrent requests (default: the plan's)."
    ),
    step_ms: list[str] = typer.Option(
        None, "--step-ms", help="MODEL=MS or MODEL=B:MS,B:MS,… (step latency)."
    ),
    p: list[str] = typer.Option(None, "--p", help="FROM:TO=PROB routing probability per step."),
    profile: str = typer.Option(None, "--profile", help="Profile JSON from `tokenrouter profile`."),
    batch: list[str] = typer.Option(None, "--batch", help="MODEL=B threshold (default: the plan's)."),
    horizon_ms: float = typer.Option(60_000.0, "--horizon-ms", help="Simulated time measured, ms."),
    warmup_ms: float = typer.Option(2_000.0, "--warmup-ms", help="Simulated time discarded first, ms."),
    seed: int = typer.Option(0, "--seed"),
    request_tokens: int = typer.Option(
        None,
        "--request-tokens",
        help="Tokens per request (default: endless); also prices the profile's prompt prefills per request.",
    ),
    think_ms: float = typer.Option(
        0.0, "--think-ms", help="Mean think time before a finished request returns."
    ),
    burstiness: float = typer.Option(
        1.0, "--burstiness", help="Squared CV of think times (1 = exponential)."
    ),
    max_delay_ms: float = typer.Option(None, "--max-delay-ms", help="Start a waiting queue after this long."),
    hop_ms: list[str] = typer.Option(
        None,
        "--hop-ms",
        help="MODEL=MS: a hop reaches MODEL this long after the sender's step ends (instant by default; "
        "served runs measure it: tokenrouter_hop_delay_seconds_total); `profile`: the profile's measured delays "
        "(workload.hop_ms).",
    ),
    gap_ms: list[str] = typer.Option(
        None,
        "--gap-ms",
        help="MODEL=MS: host time each step of MODEL takes beyond its latency (none by default; served runs measure "
        "the gap between back-to-back steps: tokenrouter_step_gap_seconds_total); `profile`: the profile's "
        "(workload.gap_ms).",
    ),
    delta_ms: float = typer.Option(0.1, "--delta-ms", help="δ of the chain shown for comparison, ms."),
    no_chain: bool = typer.Option(False, "--no-chain", help="Do not compute the chain's prediction."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    requests: str = typer.Option(
        None,
        "--requests",
        help="A `tokenrouter bench --json` report: replay its requests, each with its own routing, as a "
        "finite run (two-model plans).",
    ),
    request_rate: float = typer.Option(
        None,
        "--request-rate",
        help="An open loop: requests arrive at R per second (Poisson), at most -n in flight, each of "
        "--request-tokens; adds each request's latencies (as `tokenrouter bench --request-rate` measures them).",
    ),
    arrivals: str = typer.Option(
        None,
        "--arrivals",
        help="A `tokenrouter bench --request-rate --json` report: an open loop on its requests' arrival times "
        "(every request measured, to the last one's end; -n and --request-tokens default to the report's), to "
        "set side by side with what that run measured.",
    ),
) -> None:
    """Discrete-event simulation of the plan's system (a closed loop of N requests, or an open loop with
    --request-rate): throughput, utilization, queueing, and an open loop's latencies."""
    from tokenrouter.throughput.commands import SystemArgs, run_simulate

    args = SystemArgs(plan, concurrency, step_ms, p, profile, request_tokens)
    cfg = {"horizon_ms": horizon_ms, "warmup_ms": warmup_ms, "seed": seed, "request_tokens": request_tokens,
           "think_ms": think_ms, "burstiness": burstiness, "max_delay_ms": max_delay_ms, "hop_ms": hop_ms,
           "gap_ms": gap_ms,
           "arrival_rate_per_s": request_rate}  # fmt: skip
    typer.echo(
        _throughput_call(run_simulate, args, batch, cfg, json_out, not no_chain, delta_ms, requests, arrivals)
    )


@app.command()
def profile(
    plan: str = typer.Argument(..., help="Plan file (.plan) or policy source (.tr)."),
    output: str = typer.Option(
        None, "-o", "--output", help="Profile JSON to write (default: PLAN.profile.json)."
    ),
    batch_sizes: str = typer.Option("1,2,4,8", "--batch-sizes", help="Batch sizes to time, e.g. 1,2,4,8."),
    prompts: int = typer.Option(8, "--prompts", help="Sample requests for the routing counts."),
    prompt_len: int = typer.Option(
        16, "--prompt-len", help="Tokens per random prompt (and per timed prefill)."
    ),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Tokens generated per sample request."),
    prompts_file: str = typer.Option(
        None, "--prompts-file", help="Text prompts, one per line (else random ids)."
    ),
    device: str = typer.Option(
        None, "--device", help="Run every model here (default: as `serve` places them)."
    ),
    repeats: int = typer.Option(5, "--repeats", help="Timed steps per batch size (the median is kept)."),
    warmup: int = typer.Option(2, "--warmup", help="Untimed steps first."),
    seed: int = typer.Option(0, "--seed"),
    from_metrics: str = typer.Option(
        None,
        "--from-metrics",
        help="Instead of timing each model alone: read L_i(b) and p_ij from a running server's /metrics "
        "(URL) or a saved copy (FILE), as the models ran side by side (serve it with --mode eager).",
    ),
    since: str = typer.Option(
        None, "--since", help="With --from-metrics: an earlier scrape (URL or FILE) to subtract."
    ),
    min_steps: int = typer.Option(
        5, "--min-steps", help="With --from-metrics: keep batch sizes seen this often."
    ),
    colocation: list[str] = typer.Option(
        None,
        "--colocation",
        help="Give twice: two --from-metrics profiles of models sharing a GPU, served at different thresholds "
        "(eager, then e.g. `serve --batch llm=3`). Writes the first with a co-location term for `tune`: how "
        "each model's step grows with its co-runners' busy share.",
    ),
    alone: str = typer.Option(
        None,
        "--alone",
        help="With --from-metrics: another profile whose latencies alone (its busy board's, else its step "
        "latencies) `tune` uses for the steps a model sharing a GPU starts while the others are idle (the served "
        "ones apply while one runs), e.g. one served at (2, 5), whose small model ran alone at every batch size. "
        "Not `tokenrouter profile PLAN`'s timings of each model on its own: on the CPU they came out 2.4x below "
        "the served steps (docs/tuning.md).",
    ),
    merge: str = typer.Option(
        None,
        "--merge",
        help="With --from-metrics: another --from-metrics profile, of the plan served at the thresholds delayed "
        "batching would use (e.g. `serve --batch slm=2 --batch llm=5`), whose latencies (every step's, alone and "
        "beside) replace this one's at the batch sizes it measured; this one's routing and other batch sizes stay.",
    ),
    keep_prefills: bool = typer.Option(
        False,
        "--keep-prefills",
        help="With --from-metrics: leave the prefill steps (those that ran a request's first tokens; in metrics of "
        "layout 1 without those counters, those whose longest row ran more than 64 new tokens) in their batch sizes' "
        "latencies instead of pricing them apart per request.",
    ),
) -> None:
    """Measure the plan's step latencies L_i(b) and routing probabilities p_ij into a profile for `tune`."""
    from tokenrouter.throughput.commands import run_profile_command

    args = (
        plan,
        output,
        batch_sizes,
        prompts,
        prompt_len,
        max_tokens,
        prompts_file,
        device,
        repeats,
        warmup,
        seed,
        from_metrics,
        since,
        min_steps,
        list(colocation or []),
        alone,
        merge,
        keep_prefills,
    )
    typer.echo(_throughput_call(run_profile_command, *args))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
