"""The generated check: greedy completions of held-out function headers by the routed plan (through the
runtime's in-process executor, the same schedulers and route kernels as `serve`) and by each model alone
(the embedded engine's own generate loop), all scored by the large model's NLL of the completion.

A prompt is up to ``context`` tokens of a held-out file ending with a one-line ``def NAME(...):`` header
(without its newline, whose BPE token carries the next line's indentation); the completion is the function body the model writes. Lower large-model NLL = text the
large model finds more likely. Greedy text can also be cheap repetition, which the large model may rate
likely, so the report gives the share of distinct tokens beside each NLL.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import torch

from .corpus import read_text_dir
from .policy_view import routed_shape
from .tokenizer import EOS, load_tokenizer

HEADER = re.compile(r"^[ \t]*def [A-Za-z_]\w*\(.*\)( -> .+)?:[ \t]*$", re.MULTILINE)
PROMPT_TOKENS = 128  # a prompt's tokens at most (the end of the file up to its header)


def context_problem(plan: dict, max_new: int) -> str | None:
    """The message when prompts of up to PROMPT_TOKENS and `max_new` generated tokens do not fit every model's
    context (the check runs all of them), else None: checked before the evaluation that comes first."""
    from .policy_view import context_error

    return context_error(plan, PROMPT_TOKENS + max_new, f"--max-new-tokens {max_new} after a prompt of up to "
                         f"{PROMPT_TOKENS} tokens")  # fmt: skip


def header_prompts(
    data_dir: Path, tokenizer_dir: Path, n: int, context: int = PROMPT_TOKENS, seed: int = 0
) -> list[list[int]]:
    tok = load_tokenizer(tokenizer_dir)
    eos = tok.token_to_id(EOS)
    cands = []
    for _name, text in read_text_dir(data_dir):
        for m in HEADER.finditer(text):
            cands.append(text[: m.end()])  # no newline: the model writes it with the indent
    if not cands:
        raise ValueError(f"no one-line function header in {data_dir}")
    random.Random(seed).shuffle(cands)
    out = []
    for c in cands[:n]:
        ids = tok.encode(c, add_special_tokens=False).ids
        out.append(([eos] + ids)[-context:])
    return out


@torch.no_grad()
def large_nll(engine, prompt: list[int], completion: list[int]) -> tuple[float, int]:
    """(sum of -log p_large(completion | prompt), tokens)."""
    if not completion:
        return 0.0, 0
    ids = prompt + completion
    logits, _ = engine.forward_full(ids)
    lp = torch.log_softmax(logits.float(), dim=-1)
    rows = torch.arange(len(prompt) - 1, len(ids) - 1)
    return float(-lp[rows, torch.tensor(completion)].sum()), len(completion)


def generated_check(plan: dict, data_dir: Path, n: int = 16, max_new: int = 48, seed: int = 0) -> dict:
    from tokenrouter.runtime import messages as m
    from tokenrouter.runtime.offline import load_offline

    shape = routed_shape(plan)
    small, large = shape.entry, shape.targets[0]
    prompts = header_prompts(data_dir, Path(plan["models"][small]["path"]), n, seed=seed)
    ex = load_offline(plan, "cpu")
    routed = ex.generate(prompts, m.SamplingSpec(temperature=0.0, max_tokens=max_new, seed=seed))
    runs: dict[str, list[list[int]]] = {"routed": [r.token_ids for r in routed]}
    writers = [w for r in routed for w in r.models]
    engines = _alone(plan, (small, large), prompts, max_new, seed, runs)
    eos = set(engines[large].info.eos_token_ids)
    out = {"prompts": len(prompts), "max_new_tokens": max_new, "small": small, "large": large, "runs": {}}
    for key, comps in runs.items():
        out["runs"][key] = _scored(engines[large], prompts, comps, eos)
    out["runs"]["routed"]["large_share"] = writers.count(large) / max(len(writers), 1)
    tok = load_tokenizer(Path(plan["models"][small]["path"]))
    out["example"] = {
        "prompt_tail": tok.decode(prompts[0][-24:]),
        **{k: tok.decode([t for t in v[0] if t not in eos]) for k, v in runs.items()},
    }
    return out


def _alone(plan: dict, models: tuple[str, str], prompts: list[list[int]], max_new: int, seed: int,
           runs: dict[str, list[list[int]]]) -> dict:  # fmt: skip
    """Each model's engine (CPU, float32), its greedy completions alone into `runs` as "MODEL alone"."""
    from tokenrouter.runtime.engine.embedded import load_engine
    from tokenrouter.runtime.engine.generate import generate
    from tokenrouter.runtime.sampling import SamplingParams

    engines = {}
    for name in models:
        engines[name] = load_engine(plan["models"][name]["path"], device="cpu", dtype="float32")
        params = [SamplingParams(temperature=0.0, max_tokens=max_new, seed=seed)] * len(prompts)
        runs[f"{name} alone"] = [g.token_ids for g in generate(engines[name], prompts, params)]
    return engines


def _scored(large, prompts: list[list[int]], completions: list[list[int]], eos: set[int]) -> dict:
    """The large model's NLL per token of the completions (EOS left out), and their distinct-token share."""
    tot, cnt, distinct = 0.0, 0, []
    for p, c in zip(prompts, completions, strict=True):
        c = [t for t in c if t not in eos]
        s, k = large_nll(large, p, c)
        tot, cnt = tot + s, cnt + k
        if c:
            distinct.append(len(set(c)) / len(c))
    return {
        "large_nll_per_token": tot / max(cnt, 1),
        "tokens": cnt,
        "distinct_token_share": sum(distinct) / max(len(distinct), 1),
    }


def format_check(check: dict) -> str:
    lines = [
        f"\ngenerated check: {check['prompts']} held-out function headers, greedy, up to {check['max_new_tokens']} "
        f"tokens each, scored by {check['large']}'s NLL per token:"
    ]
    for key, r in check["runs"].items():
        share = f", large share {r['large_share']:.3f}" if "large_share" in r else ""
        lines.append(
            f"  {key:>12}: NLL {r['large_nll_per_token']:.4f} over {r['tokens']} tokens, distinct tokens "
            f"{r['distinct_token_share']:.3f}{share}"
        )
    return "\n".join(lines)
