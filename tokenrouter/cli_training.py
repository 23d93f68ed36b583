"""The router and quality commands of `tokenrouter` (`init-router`, `train-router`, `eval`, `calibrate`): their
options, declared here and registered by `cli.py`; the work is `tokenrouter.training.commands`'."""

from __future__ import annotations

import typer

from tokenrouter.cli_support import defines, require_files, user_errors


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
    from tokenrouter.compiler.plan import PlanError
    from tokenrouter.training import commands
    from tokenrouter.training.settings import TrainSettingsError

    require_files([plan_file])
    with user_errors((ValueError, 2)):
        layers = commands.hidden_layers_option(hidden_layers)
    with user_errors((TrainSettingsError, 2), ((PlanError, ValueError, OSError), 1)):
        typer.echo(commands.init_router_command(plan_file, router, output, seed, layers, hidden_size, force))


def train_router(
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
    from tokenrouter.training import commands
    from tokenrouter.training.policy_view import PolicyViewError
    from tokenrouter.training.settings import TrainSettingsError

    with user_errors((ValueError, 2)):
        teacher = commands.teacher_config(max_tokens, seq_len, prompt)
        layers = commands.hidden_layers_option(hidden_layers)
        cfg = commands.train_config(label=label, loss=loss, top_share=top_share, hidden_layers=layers,
                                    epochs=epochs, lr=lr, seed=seed, ensemble=ensemble)  # fmt: skip
    with user_errors((TrainSettingsError, 2), ((PolicyViewError, ValueError, OSError), 1)):
        lines = commands.train_router_command(
            plan_file, router, defines(define), data, output, teacher, cfg, cache
        )
    typer.echo("\n".join(lines))


def eval_(
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
    from pathlib import Path

    from tokenrouter.training import commands
    from tokenrouter.training.evaluate import plot as plot_curves
    from tokenrouter.training.policy_view import PolicyViewError
    from tokenrouter.training.settings import TrainSettingsError

    with user_errors((ValueError, 2)):
        teacher = commands.teacher_config(max_tokens, seq_len, prompt)
        cfg = commands.eval_config(param, shares, seed, plot, generate_n, max_new)
    with user_errors((TrainSettingsError, 2), ((PolicyViewError, ValueError), 1)):
        result = commands.eval_command(plan_file, defines(define), defines(versus) if versus else None, data,
                                       teacher, cfg, cache, generate_n, max_new)  # fmt: skip
    if plot is not None:
        with user_errors((OSError, 1, f"error: cannot write {plot}: ")):
            plot_curves(result, Path(plot))
    typer.echo("\n".join(commands.eval_text(result, json_out, plot)))


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
    from tokenrouter.runtime.engine.base import EngineError
    from tokenrouter.training import commands
    from tokenrouter.training.policy_view import PolicyViewError
    from tokenrouter.training.settings import TrainSettingsError

    with user_errors((TrainSettingsError, 2), ((PolicyViewError, EngineError, ValueError), 1)):
        commands.check_calibrate(share, num_prompts, prompt_len, max_tokens, iterations)
        got = commands.calibrate_command(plan_file, defines(define), share, param, prompts_file, num_prompts,
                                         prompt_len, max_tokens, iterations, device)  # fmt: skip
    if "warning" in got:
        typer.echo(f"warning: {got['warning']}", err=True)
    typer.echo(commands.calibrate_text(got, param, share, num_prompts * max_tokens, json_out))
