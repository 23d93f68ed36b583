"""Offline generation on one engine: a small continuous-batching loop (every unfinished request steps each
iteration; finished ones are released). Used by `tokenrouter generate` and by tests; the serving path has
its own scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tokenrouter.runtime.engine.base import Engine, StepInput
from tokenrouter.runtime.engine.config import ModelFolderError
from tokenrouter.runtime.sampling import SamplingParams, SamplingTensors, sample


@dataclass(slots=True)
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated, including a stop/EOS token that ended it
    finish_reason: str  # "stop" | "length"


def generate(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    *,
    rid_prefix: str = "gen",
) -> list[GenerationResult]:
    """Generate for every prompt, batched. Requests are released when they finish (also on error)."""
    if len(prompts) != len(params):
        raise ValueError("one SamplingParams per prompt")
    eos = set(engine.info.eos_token_ids)
    rids = [f"{rid_prefix}-{i}" for i in range(len(prompts))]
    results = [GenerationResult(list(p), [], "") for p in prompts]
    pending = {i: list(p) for i, p in enumerate(prompts)}  # request index -> tokens to feed next
    try:
        while pending:
            order = list(pending)
            out = engine.forward([StepInput(rids[i], pending[i]) for i in order])
            st = SamplingTensors.from_params([params[i] for i in order], out.logits.device)
            positions = torch.tensor([engine.seq_len(rids[i]) for i in order], device=out.logits.device)
            tokens = sample(
                out.logits, st.temperature, st.top_k, st.top_p, st.seed, positions,
                restrict=st.restrict, all_greedy=st.all_greedy,
            ).tolist()  # fmt: skip
            for i, tok in zip(order, tokens, strict=True):
                res, p = results[i], params[i]
                res.token_ids.append(tok)
                if tok in p.stop_token_ids or (not p.ignore_eos and tok in eos):
                    res.finish_reason = "stop"
                elif len(res.token_ids) >= p.max_tokens or engine.seq_len(rids[i]) + 1 > engine.info.max_len:
                    res.finish_reason = "length"
                if res.finish_reason:
                    del pending[i]
                    engine.release(rids[i])
                else:
                    pending[i] = [tok]
    finally:
        for i in pending:
            engine.release(rids[i])
    return results


def load_tokenizer(folder: str | Path):
    """The folder's tokenizer.json as a `tokenizers.Tokenizer`; ModelFolderError names a missing file."""
    from tokenizers import Tokenizer

    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise ModelFolderError(f"{Path(folder)}: no tokenizer.json in the model folder")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise ModelFolderError(f"{path}: cannot read tokenizer ({e})") from e


def apply_chat_template(folder: str | Path, messages: list[dict]) -> str:
    """The folder's chat template rendered with the generation prompt, as the server renders it (`TextCodec`)."""
    import json

    from tokenrouter.runtime.frontend.codec import TemplateError, TextCodec

    try:
        return TextCodec(folder).apply_chat_template(messages)
    except FileNotFoundError as e:
        raise ModelFolderError(str(e)) from e
    except (TemplateError, json.JSONDecodeError) as e:
        raise ModelFolderError(f"{Path(folder)}: {e}") from e


def generate_from_folder(
    folder: str | Path,
    *,
    prompt: str | None,
    prompt_ids: list[int] | None,
    params: SamplingParams,
    device: str = "cpu",
    dtype: str | None = None,
    load: str = "auto",
    chat: bool = False,
) -> dict:
    """`tokenrouter generate MODEL_DIR`: one prompt, in-process. Returns a JSON-able dict with `token_ids`
    and `text`. Raises ModelFolderError / EngineError / ValueError with user-facing messages."""
    from tokenrouter.runtime.engine.embedded import load_engine

    if (prompt is None) == (prompt_ids is None):
        raise ValueError("give exactly one of a text prompt or prompt token ids")
    if chat and prompt is None:
        raise ValueError("a chat template applies to a text prompt, not to token ids")
    from tokenrouter.runtime import threads

    threads.set_torch_threads(1)
    engine = load_engine(folder, device=device, dtype=dtype, load=load, max_batch=1, max_reqs=1)
    tokenizer = load_tokenizer(folder) if prompt is not None else None
    if prompt is not None:
        text = apply_chat_template(folder, [{"role": "user", "content": prompt}]) if chat else prompt
        prompt_ids = tokenizer.encode(text).ids
        if not prompt_ids:
            raise ValueError("the prompt is empty after tokenization")
    bad = [t for t in prompt_ids if not 0 <= t < engine.info.vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is out of range 0..{engine.info.vocab_size - 1}")
    (result,) = generate(engine, [prompt_ids], [params])
    if tokenizer is None and (Path(folder) / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(folder)
    text = None
    if tokenizer is not None:
        known = tokenizer.get_vocab_size()
        text = tokenizer.decode([t for t in result.token_ids if t < known], skip_special_tokens=True)
    return {
        "model": str(folder),
        "prompt_token_ids": result.prompt_token_ids,
        "token_ids": result.token_ids,
        "text": text,
        "finish_reason": result.finish_reason,
    }
