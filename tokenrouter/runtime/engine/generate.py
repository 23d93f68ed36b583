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
            _step(engine, pending, rids, params, results, eos)
    finally:
        for i in pending:
            engine.release(rids[i])
    return results


def _step(
    engine: Engine,
    pending: dict[int, list[int]],
    rids: list[str],
    params: Sequence[SamplingParams],
    results: list[GenerationResult],
    eos: set[int],
) -> None:
    """One step of `generate` over the pending requests: a token each; a finished request is released and
    leaves `pending`, the others feed their token next."""
    order = list(pending)
    out = engine.forward([StepInput(rids[i], pending[i]) for i in order])
    tokens = _sample(engine, out.logits, [params[i] for i in order], [rids[i] for i in order])
    for i, tok in zip(order, tokens, strict=True):
        res = results[i]
        res.token_ids.append(tok)
        res.finish_reason = _finish_reason(engine, res, params[i], tok, eos, rids[i])
        if res.finish_reason:
            del pending[i]
            engine.release(rids[i])
        else:
            pending[i] = [tok]


def _sample(engine: Engine, logits: torch.Tensor, params: list[SamplingParams], rids: list[str]) -> list[int]:
    """One token per row of `logits`, drawn by the row's sampling parameters at its request's position."""
    st = SamplingTensors.from_params(params, logits.device)
    positions = torch.tensor([engine.seq_len(rid) for rid in rids], device=logits.device)
    return sample(
        logits, st.temperature, st.top_k, st.top_p, st.seed, positions,
        restrict=st.restrict, all_greedy=st.all_greedy,
    ).tolist()  # fmt: skip


def _finish_reason(
    engine: Engine, res: GenerationResult, p: SamplingParams, tok: int, eos: set[int], rid: str
) -> str:
    """ "stop" (a stop or end-of-sequence token), "length" (max_tokens or the context is full) or ""."""
    if tok in p.stop_token_ids or (not p.ignore_eos and tok in eos):
        return "stop"
    if len(res.token_ids) >= p.max_tokens or engine.seq_len(rid) + 1 > engine.info.max_len:
        return "length"
    return ""


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
    _check_prompt(prompt, prompt_ids, chat)
    engine = _load_single(folder, device, dtype, load)
    tokenizer, prompt_ids = _tokenize(folder, prompt, prompt_ids, chat)
    _check_ids(prompt_ids, engine.info.vocab_size)
    (result,) = generate(engine, [prompt_ids], [params])
    return {
        "model": str(folder),
        "prompt_token_ids": result.prompt_token_ids,
        "token_ids": result.token_ids,
        "text": _decode(folder, tokenizer, result.token_ids),
        "finish_reason": result.finish_reason,
    }


def _load_single(folder: str | Path, device: str, dtype: str | None, load: str) -> Engine:
    """An engine for one request on one torch thread."""
    from tokenrouter.runtime import threads
    from tokenrouter.runtime.engine.embedded import load_engine

    threads.set_torch_threads(1)
    return load_engine(folder, device=device, dtype=dtype, load=load, max_batch=1, max_reqs=1)


def _check_prompt(prompt: str | None, prompt_ids: list[int] | None, chat: bool) -> None:
    if (prompt is None) == (prompt_ids is None):
        raise ValueError("give exactly one of a text prompt or prompt token ids")
    if chat and prompt is None:
        raise ValueError("a chat template applies to a text prompt, not to token ids")


def _check_ids(prompt_ids: list[int], vocab_size: int) -> None:
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is out of range 0..{vocab_size - 1}")


def _tokenize(folder: str | Path, prompt: str | None, prompt_ids: list[int] | None, chat: bool) -> tuple:
    """(the folder's tokenizer or None, the prompt's token ids): a text prompt is encoded (in the folder's
    chat template with `chat`; ValueError when it has no tokens), token ids are taken as they are."""
    if prompt is None:
        return None, prompt_ids
    tokenizer = load_tokenizer(folder)
    text = apply_chat_template(folder, [{"role": "user", "content": prompt}]) if chat else prompt
    prompt_ids = tokenizer.encode(text).ids
    if not prompt_ids:
        raise ValueError("the prompt is empty after tokenization")
    return tokenizer, prompt_ids


def _decode(folder: str | Path, tokenizer, token_ids: list[int]) -> str | None:
    """The generated text (None without a tokenizer); ids past the tokenizer's vocabulary are left out."""
    if tokenizer is None and (Path(folder) / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(folder)
    if tokenizer is None:
        return None
    known = tokenizer.get_vocab_size()
    return tokenizer.decode([t for t in token_ids if t < known], skip_special_tokens=True)
