"""The work of the router and quality commands (`init-router`, `train-router`, `eval`, `calibrate`): settings
checked before any work, the work, and the text to print. A usage mistake raises `ValueError` from the
settings functions and `TrainSettingsError` from the work; a policy or run that cannot be used raises
`PolicyViewError`, `PlanError`, `EngineError`, `ValueError` or `OSError` (messages for users)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenrouter.outfile import finite_json
from tokenrouter.training.settings import TrainSettingsError


def hidden_layers_option(text: str) -> tuple[int, ...]:
    """`--hidden-layers 256,128`."""
    from tokenrouter.runtime.route.routers import parse_hidden_layers

    try:
        return parse_hidden_layers(text)
    except ValueError as exc:
        raise ValueError(f"--hidden-layers: {exc}") from None


def init_router_command(plan_file: str, router: str, output: str | None, seed: int, layers: tuple[int, ...],
                        hidden_size: int | None, force: bool) -> str:  # fmt: skip
    """Write an untrained router file of the right shape; the line that says what was written."""
    from tokenrouter.compiler.driver import load_plan
    from tokenrouter.runtime.route.routers import init_router_file
    from tokenrouter.training.router_train import router_size_problem

    if hidden_size is not None and hidden_size < 1:
        raise TrainSettingsError("--hidden-size must be >= 1")
    plan = load_plan(plan_file, weights_check=False)  # the router file is what it writes
    output = _router_output(plan, router, output, force)
    if problem := router_size_problem(plan, router, layers, hidden_size):
        raise TrainSettingsError(problem)
    try:
        spec, width = init_router_file(
            plan, router, output, seed=seed, hidden_layers=layers, hidden_size=hidden_size
        )
    except OSError as exc:
        raise OSError(f"cannot write {output}: {exc}") from exc
    shape = f"[1, {width}]" if spec.kind == "linear" else " -> ".join(str(n) for n in (width, *layers, 1))
    return f"wrote {output}: untrained {spec.kind} router {router!r}, D = {width} ({spec.inputs_text()}), {shape}"


def _router_output(plan: dict, router: str, output: str | None, force: bool) -> str | None:
    """Where `init-router` writes (-o, else the router's path), checked before the weights are drawn: a folder
    at the path (`ValueError`), or a file there without `force` (`TrainSettingsError`)."""
    from tokenrouter.training.settings import output_problem

    what = "-o" if output is not None else f"the path of router {router!r}"
    if output is None:
        output = (plan.get("routers") or {}).get(router, {}).get("path")
    if output is not None and (problem := output_problem(Path(output), what)):
        raise ValueError(problem)
    if output is not None and Path(output).exists() and not force:
        raise TrainSettingsError(f"{output} exists (a trained router, perhaps); --force overwrites it")
    return output


def teacher_config(max_tokens: int, seq_len: int, prompt: int):
    """The teacher forcing's settings (`ValueError`: a usage mistake)."""
    from tokenrouter.training.teacher import TeacherConfig

    return TeacherConfig(seq_len=seq_len, prompt=prompt, max_tokens=max_tokens)


def train_config(**fields):
    """`train-router`'s RouterTrainConfig from its options by RouterTrainConfig's names."""
    from tokenrouter.training.router_train import RouterTrainConfig

    try:
        return RouterTrainConfig(**fields)
    except ValueError as exc:
        raise ValueError(f"bad training settings: {exc}") from None


def train_router_command(plan_file: str, router: str, defines: dict[str, str], data: str, output: str | None,
                         teacher, cfg, cache: str | None) -> list[str]:  # fmt: skip
    """Train the router and write its file; the lines of the report."""
    from tokenrouter.training.policy_view import load_plan
    from tokenrouter.training.router_train import format_report, train_router

    # train_router checks its settings and output path before the teacher forcing
    plan = load_plan(plan_file, defines, weights_check=False)  # the router is what it writes
    rep = train_router(plan, router, Path(data), Path(output) if output else None, teacher, cfg,
                       cache=Path(cache) if cache else None)  # fmt: skip
    lines = [f"teacher-forced rows: cache {rep.cache}"] if rep.cache != "off" else []
    lines.append(
        f"wrote {rep.path}: router {router!r} trained on {rep.rows_train} positions, {rep.rows_val} held out"
    )
    return [*lines, format_report(rep)]


def eval_config(param: str, shares: str, seed: int, plot: str | None, generate_n: int, max_new: int):
    """`eval`'s EvalConfig, after its options' checks."""
    from tokenrouter.training.evaluate import EvalConfig

    try:
        values = tuple(float(x) for x in shares.split(",") if x.strip())
    except ValueError:
        raise ValueError(
            f"--shares {shares!r}: expected fractions in (0, 1) separated by commas, e.g. 0.1,0.25"
        ) from None
    try:
        cfg = EvalConfig(param=param, shares=values, seed=seed)
    except ValueError as exc:
        raise ValueError(f"--shares: {exc}") from None
    if plot is not None and not plot.endswith(".png"):
        raise ValueError("--plot takes a .png file name")
    if generate_n < 0 or max_new < 1:
        raise ValueError("--generate must be >= 0 and --max-new-tokens >= 1")
    return cfg


def eval_command(plan_file: str, defines: dict[str, str], versus: dict[str, str] | None, data: str, teacher,
                 cfg, cache: str | None, generate_n: int, max_new: int) -> dict:  # fmt: skip
    """The evaluation (with `generate_n`, the generated check's result under "generated"). `versus`: the
    params of the policy compared with, on top of `defines`."""
    from tokenrouter.training.evaluate import evaluate
    from tokenrouter.training.gencheck import context_problem
    from tokenrouter.training.policy_view import load_plan

    plan = load_plan(plan_file, defines)
    other = load_plan(plan_file, {**defines, **versus}) if versus else None
    # the generated check runs after the evaluation, which checks its own settings (--cache, --seq-len)
    if generate_n and (problem := context_problem(plan, max_new)):
        raise TrainSettingsError(problem)
    result = evaluate(plan, Path(data), teacher, cfg, cache=Path(cache) if cache else None, versus=other)
    if generate_n:
        result["generated"] = _generated(plan, Path(data), generate_n, max_new, cfg.seed)
    return result


def _generated(plan: dict, data: Path, n: int, max_new: int, seed: int) -> dict:
    from tokenrouter.runtime.engine.base import EngineError
    from tokenrouter.training.gencheck import generated_check

    try:
        return generated_check(plan, data, n, max_new, seed)
    except (EngineError, ValueError) as exc:
        raise ValueError(f"generated check: {exc}") from exc


def eval_text(result: dict, json_out: bool, plot: str | None) -> list[str]:
    """What `eval` prints: JSON, or the table, the generated check and where the chart went."""
    from tokenrouter.training.evaluate import format_table
    from tokenrouter.training.gencheck import format_check

    if json_out:
        return [json.dumps(finite_json(result), indent=1)]
    lines = [format_table(result)]
    if "generated" in result:
        lines.append(format_check(result["generated"]))
    return lines + ([f"wrote {plot}"] if plot is not None else [])


def calibrate_prompts(
    plan: dict, prompts_file: str | None, num_prompts: int, prompt_len: int
) -> list[list[int]]:
    """The prompts as `bench` would send them, as token ids (a text file's by the entry model's tokenizer)."""
    from tokenrouter.loadgen.bench import LoadSpec, make_prompts
    from tokenrouter.runtime.engine.generate import load_tokenizer

    prompts = make_prompts(
        LoadSpec(num_prompts=num_prompts, prompt_len=prompt_len, prompts_file=prompts_file)
    )
    if prompts_file:
        tok = load_tokenizer(plan["models"][plan["entry"]]["path"])
        prompts = [tok.encode(p).ids if isinstance(p, str) else p for p in prompts]
    return prompts


def check_calibrate(
    share: float, num_prompts: int, prompt_len: int, max_tokens: int, iterations: int
) -> None:
    """`calibrate`'s numbers checked before anything is loaded."""
    if not 0.0 < share < 1.0 or num_prompts < 1 or prompt_len < 1 or max_tokens < 1 or iterations < 1:
        raise TrainSettingsError(
            "--share must be in (0, 1); --num-prompts, --prompt-len, --max-tokens and --iterations at least 1"
        )


def calibrate_command(plan_file: str, defines: dict[str, str], share: float, param: str, prompts_file: str | None,
                      num_prompts: int, prompt_len: int, max_tokens: int, iterations: int,
                      device: str | None) -> dict:  # fmt: skip
    """`calibrate_threshold` on the plan and the prompts, after the check that they fit every model's context."""
    from tokenrouter.training.calibrate import calibrate_threshold
    from tokenrouter.training.policy_view import context_error, load_plan

    plan = load_plan(plan_file, defines)
    prompts = calibrate_prompts(plan, prompts_file, num_prompts, prompt_len)
    longest = max(len(p) for p in prompts)
    asked = (f"the longest prompt of {prompts_file} ({longest} tokens)" if prompts_file
             else f"--prompt-len {prompt_len}") + f" and --max-tokens {max_tokens}"  # fmt: skip
    # as `bench` checks it, before any work
    if problem := context_error(plan, longest + max_tokens, asked):
        raise TrainSettingsError(problem)
    return calibrate_threshold(plan, param, share, prompts, max_tokens, device, iterations=iterations)


def calibrate_text(got: dict, param: str, share: float, tokens: int, json_out: bool) -> str:
    """What `calibrate` prints (its warning goes to stderr apart)."""
    if json_out:
        return json.dumps(finite_json(got))
    return (
        f"{param} = {got['threshold']:.6g}: the other models wrote {got['share']:.3f} of "
        f"{tokens} tokens (wanted {share:g}); the entry model's solo generations alone "
        f"would give {param} = {got['solo_threshold']:.6g}, served {got['solo_share']:.3f}"
    )
