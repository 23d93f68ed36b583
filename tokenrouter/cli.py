"""The `tokenrouter` command line.

Each command is a thin wrapper: it parses arguments, calls into the package, prints, and maps user
mistakes to exit status 1 (errors in the input) or 2 (bad usage). Heavy imports (torch, the runtime)
happen inside the commands so that `tokenrouter check` starts fast.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="tokenrouter",
    help="Token-level LLM routing: check, compile and serve .tr policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



@app.callback()
def _root() -> None:
    """Token-level LLM routing: check, compile and serve .tr policies."""


# --- benchmark commands ---


@app.command()
def bench(
    url: str = typer.Option("http://127.0.0.1:8000", help="Base URL of an OpenAI-compatible server."),
    concurrency: int = typer.Option(4, "--concurrency", "-c", help="Requests in flight (closed loop)."),
    num_prompts: int = typer.Option(32, "--num-prompts", "-n", help="Requests to send in all."),
    output_len: int = typer.Option(128, help="Tokens to generate per request (max_tokens)."),
    prompt_len: int = typer.Option(32, help="Length of synthetic token-id prompts."),
    prompts_file: str = typer.Option(None, help="Text file, one prompt per line, instead of synthetic prompts."),
    ignore_eos: bool = typer.Option(True, help="Ask the server to ignore EOS (fixed output length)."),
    temperature: float = typer.Option(0.0),
    seed: int = typer.Option(0),
    model: str = typer.Option(None, help="Model id (default: the first one /v1/models lists)."),
    api_key: str = typer.Option(None, envvar="TOKENROUTER_API_KEY"),
    json_out: str = typer.Option(None, "--json", help="Also write the report as JSON to this file."),
    progress: bool = typer.Option(True, help="Show a progress bar on stderr."),
) -> None:
    """Load-test a running server: decode throughput, TTFT, TPOT, latency percentiles, tokens per model."""
    import asyncio
    import json

    from tokenrouter.runtime.loadgen import LoadSpec, format_report, run_load

    try:
        spec = LoadSpec(
            url=url, model=model, concurrency=concurrency, num_prompts=num_prompts, output_len=output_len,
            prompt_len=prompt_len, prompts_file=prompts_file, ignore_eos=ignore_eos, temperature=temperature,
            seed=seed, api_key=api_key, progress=progress,
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        report = asyncio.run(run_load(spec))
    except Exception as exc:  # connection refused, bad URL: a user-facing condition, not a bug
        typer.echo(f"error: could not benchmark {url}: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(format_report(report))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=2)
    if report["failed"]:
        raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
