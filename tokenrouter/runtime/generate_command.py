"""The work of `tokenrouter generate`: one prompt in this process, through a model folder
(`engine/generate.py`) or every model of a plan with its routing (`offline.py`). `generate_job` checks the
options (`ValueError`: a usage mistake), `run_generate` runs the job, `output_lines` is what the command prints."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from tokenrouter.options import defines
from tokenrouter.outfile import finite_json
from tokenrouter.runtime.sampling import SamplingParams


@dataclass(slots=True)
class GenerateJob:
    path: str
    is_plan: bool
    prompt: str | None
    prompt_ids: list[int] | None
    params: SamplingParams
    device: str
    dtype: str | None
    load: str
    chat: bool
    defines: dict[str, str]


def parse_ids(text: str) -> list[int]:
    """`--prompt-ids 1,2,3`."""
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated ints, got {text!r}") from None
    if not ids:
        raise ValueError("--prompt-ids is empty")
    return ids


def generate_job(path: str, prompt: str | None, prompt_ids: str | None, sampling: dict, *, device: str,
                 dtype: str | None, load: str, trace: bool, define: list[str] | None, chat: bool) -> GenerateJob:  # fmt: skip
    """`generate`'s options checked (`sampling`: temperature, top_k, top_p, seed, max_tokens, ignore_eos)."""
    is_plan = _check_path(path, trace, define)
    if (prompt is None) == (prompt_ids is None):
        raise ValueError("give exactly one of --prompt or --prompt-ids")
    ids = parse_ids(prompt_ids) if prompt_ids is not None else None
    if is_plan:
        if dtype is not None or load != "auto":
            raise ValueError("--dtype and --load come from the plan's model options for a plan")
        if chat:
            raise ValueError("--chat applies to a model folder (not supported for plans yet)")
        bound = defines(define)
        if bound and not path.endswith(".tr"):
            raise ValueError("-D applies to a .tr policy; a plan's params are already bound")
    elif chat and prompt is None:
        raise ValueError("--chat needs --prompt (a chat template applies to text)")
    params = SamplingParams(**sampling)
    return GenerateJob(
        path, is_plan, prompt, ids, params, device, dtype, load, chat, bound if is_plan else {}
    )


def _check_path(path: str, trace: bool, define: list[str] | None) -> bool:
    """Whether `path` is a plan or policy (else a model folder); ValueError for neither, or for plan-only
    options given with a folder."""
    if not os.path.exists(path):
        raise ValueError(f"no such model folder, plan or policy: {path}")
    is_plan = not os.path.isdir(path)
    if is_plan and not path.endswith((".plan", ".tr")):
        raise ValueError(f"{path}: not a model folder, a plan (.plan) or a policy (.tr)")
    if not is_plan and (trace or define):
        raise ValueError("--trace and -D apply to a plan or policy, not a model folder")
    return is_plan


def run_generate(job: GenerateJob) -> dict:
    """The generation, as `generate --json` prints it. Raises `PlanInputError` (its message already for the
    user), `EngineError` or `ValueError`."""
    if not job.is_plan:
        from tokenrouter.runtime.engine.generate import generate_from_folder

        return generate_from_folder(job.path, prompt=job.prompt, prompt_ids=job.prompt_ids, params=job.params,
                                    device=job.device, dtype=job.dtype, load=job.load, chat=job.chat)  # fmt: skip
    from tokenrouter.runtime.messages import SamplingSpec
    from tokenrouter.runtime.offline import generate_from_plan

    p = job.params
    spec = SamplingSpec(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed,
                        max_tokens=p.max_tokens, ignore_eos=p.ignore_eos)  # fmt: skip
    return generate_from_plan(job.path, prompt=job.prompt, prompt_ids=job.prompt_ids, sampling=spec,
                              device=None if job.device == "cuda" else job.device, defines=job.defines)  # fmt: skip


def output_lines(out: dict, json_out: bool, trace: bool) -> list[str]:
    """JSON, or the text (token ids without a tokenizer), then with `trace` a line per token and a summary."""
    if json_out:
        return [json.dumps(finite_json(out))]
    lines = [out["text"] if out["text"] is not None else ",".join(map(str, out["token_ids"]))]
    if trace:
        pieces = out["pieces"] or [""] * len(out["token_ids"])
        for i, (tok, model, piece) in enumerate(zip(out["token_ids"], out["models"], pieces, strict=True)):
            lines.append(f"{i:4d}  {model:<12} {tok:>7}  {piece!r}")
        per_model = ", ".join(f"{k} {v}" for k, v in out["tokens_per_model"].items())
        lines.append(f"tokens: {per_model}; hops: {len(out['hops'])}; finish: {out['finish_reason']}")
    return lines
