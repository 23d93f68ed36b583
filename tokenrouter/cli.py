"""The `tokenrouter` command line: the typer app and its commands' options.

Each command parses its arguments, calls the package that does the work, prints what it returns, and maps
user mistakes to exit status 1 (errors in the input) or 2 (bad usage) through `cli_support.user_errors`.
The router and quality commands are declared in `cli_training.py`, the throughput model's in
`cli_throughput.py`; every command is registered here, in the order `--help` lists them. Heavy imports
(torch, the runtime) happen inside the commands so that `tokenrouter check` starts fast.
"""

from __future__ import annotations

from typing import Any

import typer

from tokenrouter import cli_throughput, cli_training
from tokenrouter.cli_help import App
from tokenrouter.cli_support import defines, fail, require_files, user_errors

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


def _no_weights_check_option() -> Any:
    """`--no-weights-check`, as `check` and `compile` take it."""
    return typer.Option(
        False,
        "--no-weights-check",
        help="For a machine without the weights: a model folder or router file that is not here is a warning, "
        "not an error (`serve` needs them).",
    )


# --- language commands ---


@app.command()
def check(
    files: list[str] = typer.Argument(..., help="Policy files (.tr)."),
    define: list[str] = typer.Option(None, "-D", "--define", help="Override a param: NAME=VALUE."),
    max_errors: int = typer.Option(50, min=1, help="Show at most this many diagnostics per file."),
    no_weights_check: bool = _no_weights_check_option(),
) -> None:
    """Check policies: report every error (and warning) in each file. Exit 1 when any has errors."""
    from tokenrouter.compiler.commands import check_file

    bound = defines(define)
    require_files(files)
    failed = False
    for path in files:
        checked = check_file(path, bound, not no_weights_check, max_errors)
        if checked.diagnostics:
            typer.echo(checked.diagnostics, err=True)
        typer.echo(checked.summary, err=checked.failed)
        failed |= checked.failed
    if failed:
        raise typer.Exit(1)


@app.command(name="compile")
def compile_(
    file: str = typer.Argument(..., help="Policy file (.tr)."),
    output: str = typer.Option(
        None, "-o", "--output", help="Plan file to write (default: FILE.plan beside FILE)."
    ),
    define: list[str] = typer.Option(None, "-D", "--define", help="Override a param: NAME=VALUE."),
    no_weights_check: bool = _no_weights_check_option(),
) -> None:
    """Compile a policy to a plan (JSON: the route IR and settings, no code)."""
    from pathlib import Path

    from tokenrouter.compiler.commands import plural
    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.compiler.plan import PlanError, write_plan
    from tokenrouter.dsl.diagnostics import render_all

    bound = defines(define)
    require_files([file])
    result = compile_file(file, bound, weights_check=not no_weights_check)
    if result.diagnostics:
        typer.echo(render_all(result.diagnostics), err=True)
    if result.plan is None:
        fail(f"{file}: not compiled ({plural(len(result.errors), 'error')})", 1)
    out = Path(output) if output else Path(file).with_suffix(".plan")
    with user_errors(((OSError, PlanError), 1, f"error: cannot write {out}: ")):
        write_plan(result.plan, out, inputs=[file])
    typer.echo(f"wrote {out}")


@app.command()
def fmt(
    files: list[str] = typer.Argument(..., help="Policy files (.tr) to format in place."),
    check_only: bool = typer.Option(False, "--check", help="Change nothing; exit 1 if a file would change."),
) -> None:
    """Format policies canonically (in place), or with --check report which would change."""
    from tokenrouter.compiler.commands import format_file

    require_files(files)
    status = 0
    for path in files:
        formatted = format_file(path, check_only)
        if formatted.message is not None:
            typer.echo(formatted.message, err=formatted.to_stderr)
        status = 1 if formatted.failed else status
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
    from tokenrouter.compiler.commands import inspect_text
    from tokenrouter.compiler.driver import load_plan
    from tokenrouter.compiler.kernels import RouteIRError
    from tokenrouter.compiler.plan import PlanError

    require_files([plan_file])
    with user_errors(((PlanError, RouteIRError, ValueError), 1)):
        # what the plan says, whether or not its weights are on this machine
        plan = load_plan(plan_file, weights_check=False)
        for text in inspect_text(plan, as_json, kernels, sampler):
            typer.echo(text)


@app.command()
def download(
    plan_file: str = typer.Argument(..., help="Plan file or policy (.tr)."),
    define: list[str] = typer.Option(None, "-D", "--define", help="Override a param: NAME=VALUE."),
) -> None:
    """Fetch every model of a policy given as a hub id into the local hub cache, ahead of `serve`."""
    from tokenrouter.compiler.driver import load_plan
    from tokenrouter.compiler.plan import PlanError
    from tokenrouter.hub import download_plan

    require_files([plan_file])
    with user_errors((PlanError, 1)):
        plan = load_plan(plan_file, defines(define))
    if download_plan(plan, lambda line: typer.echo(line, err=line.startswith("error:"))):
        raise typer.Exit(1)


app.command(name="init-router")(cli_training.init_router)


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
    from tokenrouter.runtime.launcher import serve as run_serve
    from tokenrouter.runtime.serve_command import serve_config

    with user_errors((ValueError, 2)):
        cfg = serve_config(plan, define=define, remote=remote, mps_sm=mps_sm, mps_low=mps_low, batch=batch,
                           host=host, port=port, api_key=api_key, tcp=tcp, device=device,
                           startup_timeout_s=startup_timeout, log_level=log_level, mode=mode, llm=llm,
                           bind_host=bind_host, heartbeat_timeout_s=heartbeat_timeout,
                           liveness_timeout_s=liveness_timeout, mps=mps, cpu_threads=cpu_threads,
                           max_body_mib=max_body_mib, body_timeout_s=body_timeout, profile_dir=profile_dir,
                           prefix_cache=prefix_cache)  # fmt: skip
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
    from tokenrouter.runtime.launcher import LaunchError
    from tokenrouter.runtime.serve_command import parse_endpoints, run_remote_subserver

    with user_errors((ValueError, 2)):
        eps = parse_endpoints(endpoints)
    options = {
        "device": device,
        "log_level": log_level,
        "cpu_threads": cpu_threads,
        "prefix_cache": prefix_cache,
    }
    with user_errors((LaunchError, 1), (ValueError, 2)):
        run_remote_subserver(plan, model, eps, options, lambda line: typer.echo(line, err=True))


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
    from tokenrouter.loadgen.bench import LoadRefused, format_report, write_report
    from tokenrouter.loadgen.command import BenchError, check_json_out, load_spec, run_bench

    with user_errors((ValueError, 2)):
        spec = load_spec(concurrency, request_rate, think_time, url=url, model=model, burstiness=burstiness,
                         warmup=warmup, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, num_prompts=num_prompts,
                         output_len=output_len, prompt_len=prompt_len, prompts_file=prompts_file,
                         ignore_eos=ignore_eos, temperature=temperature, seed=seed, api_key=api_key,
                         progress=progress, shared_prefix_len=shared_prefix_len, prefix_groups=prefix_groups,
                         turns=turns, system_len=system_len)  # fmt: skip
    if json_out:
        with user_errors((OSError, 2, f"error: cannot write --json {json_out}: ")):
            check_json_out(json_out)
    with user_errors((LoadRefused, 2), (BenchError, 1)):
        report = run_bench(spec)
    typer.echo(format_report(report))
    if json_out:
        with user_errors((OSError, 1, f"error: cannot write --json {json_out}: ")):
            write_report(report, json_out)
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

    with user_errors(((ValueError, TypeError), 2)):
        spec = shape_for(shape, arch=arch, hidden=hidden, intermediate=intermediate, layers=layers, heads=heads,
                         kv_heads=kv_heads, head_dim=head_dim, vocab=vocab, tie=tie)  # fmt: skip
    with user_errors(((ValueError, OSError), 1)):
        out = make_model(out_dir, spec, seed=seed, weights=weights, force=force)
    config = load_model_config(out)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    what = ", ".join(files) if files else "no weights (load with load='dummy')"
    typer.echo(f"wrote {out}: {config.architecture}, {config.num_params() / 1e6:.2f}M parameters, {what}")


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
    from tokenrouter.runtime.engine.base import EngineError
    from tokenrouter.runtime.generate_command import generate_job, output_lines, run_generate
    from tokenrouter.runtime.offline import PlanInputError

    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
                "max_tokens": max_tokens, "ignore_eos": ignore_eos}  # fmt: skip
    with user_errors((ValueError, 2)):
        job = generate_job(path, prompt, prompt_ids, sampling, device=device, dtype=dtype, load=load, trace=trace,
                           define=define, chat=chat)  # fmt: skip
    with user_errors((PlanInputError, 1, ""), ((EngineError, ValueError), 1)):
        out = run_generate(job)
    typer.echo("\n".join(output_lines(out, json_out, trace)))


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

    with user_errors((TraceUsageError, 2), (TraceFormatError, 1), (OSError, 1, "error: cannot write: ")):
        typer.echo("\n".join(command(file, output, png)))


# --- training and quality commands ---

app.command(name="train-router")(cli_training.train_router)
app.command(name="eval")(cli_training.eval_)
app.command()(cli_training.calibrate)

# --- throughput commands ---

app.command()(cli_throughput.tune)
app.command()(cli_throughput.simulate)
app.command()(cli_throughput.profile)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
