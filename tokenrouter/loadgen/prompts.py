"""A load's requests: from a prompts file, or synthetic token ids drawn with the seed (a conversation load's
first turns; the warm-up's from another seed), an open loop's arrival times, and the check that they fit the
served model's context."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenrouter.loadgen.spec import ContextTooLong, LoadSpec, Request


def read_prompts_file(spec: LoadSpec) -> list[Request]:
    """A prompts file's requests. A `.jsonl` file has one JSON object a line: `prompt` (text, or a list of token
    ids) and optionally `output_len` (an int >= 1; the spec's `output_len` where absent); any other file is
    text, one prompt a line, each asking for `output_len` tokens. Blank lines are skipped. A bad line is a
    ValueError that names the file and line."""
    path = Path(spec.prompts_file)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
    out: list[Request] = []
    jsonl = path.suffix.lower() == ".jsonl"
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        out.append(
            _jsonl_request(path, number, line, spec.output_len) if jsonl else Request(line, spec.output_len)
        )
    if not out:
        raise ValueError(f"prompts file has no prompts: {path}")
    return out


def _jsonl_request(path: Path, number: int, line: str, default_len: int) -> Request:
    where = f"{path}:{number}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not a JSON object: {exc.msg}") from None
    if not isinstance(obj, dict) or "prompt" not in obj:
        raise ValueError(f'{where}: each line must be a JSON object with a "prompt"')
    prompt, length = obj["prompt"], obj.get("output_len", default_len)
    ids = isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt
    )
    if not ((isinstance(prompt, str) and prompt) or (ids and prompt)):
        raise ValueError(f'{where}: "prompt" must be a non-empty string or list of token ids (ints >= 0)')
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ValueError(f'{where}: "output_len" must be an int >= 1, got {length!r}')
    return Request(prompt, length)


def make_requests(spec: LoadSpec) -> list[Request]:
    """The measured requests: the prompts file's in turn, or synthetic token ids drawn with the seed (a
    conversation load's: each conversation's first turn)."""
    if spec.conversations:
        from tokenrouter.loadgen.workloads import first_prompt

        return [Request(first_prompt(c), c.output_len) for c in make_conversations(spec)]
    if spec.shared_prefix_len:
        from tokenrouter.loadgen.workloads import shared_prefix_prompts

        prompts = shared_prefix_prompts(spec, spec.num_prompts, spec.seed)
        return [Request(p, spec.output_len) for p in prompts]
    if spec.prompts_file:
        pool = read_prompts_file(spec)
        return [pool[i % len(pool)] for i in range(spec.num_prompts)]
    return [Request(p, spec.output_len) for p in _synthetic(spec, spec.num_prompts, spec.seed)]


def make_conversations(spec: LoadSpec) -> list:
    """A conversation load's conversations: the file's, in turn, or synthetic ones drawn with the seed."""
    from tokenrouter.loadgen.workloads import read_conversations, synthetic_conversations

    if spec.prompts_file:
        pool = read_conversations(spec.prompts_file, spec.output_len)
        return [pool[i % len(pool)] for i in range(spec.num_prompts)]
    return synthetic_conversations(spec, spec.num_prompts, spec.seed)


def make_prompts(spec: LoadSpec) -> list[str | list[int]]:
    """The measured requests' prompts."""
    return [r.prompt for r in make_requests(spec)]


def _synthetic(spec: LoadSpec, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(spec.vocab_low, spec.vocab_high) for _ in range(spec.prompt_len)] for _ in range(count)
    ]


def warmup_requests(spec: LoadSpec) -> list[Request]:
    """The warm-up's requests: synthetic prompts drawn from another seed than the measured ones, so that a prefix
    cache holds none of those; from a prompts file, its requests from the last one backwards, so that a warm-up
    shorter than the file sends none of the first measured ones."""
    if spec.prompts_file and not spec.conversations:
        pool = read_prompts_file(spec)
        return [pool[-1 - i % len(pool)] for i in range(spec.warmup)]
    return [Request(p, spec.output_len) for p in _synthetic(spec, spec.warmup, spec.seed + WARMUP_SEED)]


WARMUP_SEED = 0x5EED  # the warm-up's synthetic prompts are drawn with the spec's seed + this


def arrival_times(spec: LoadSpec, count: int) -> list[float]:
    """An open loop's arrival times, seconds after the start: the first at 0, then gaps drawn from a gamma
    distribution of shape `burstiness` and mean 1 / `request_rate` (a Poisson process at burstiness 1),
    seeded by the spec's seed. A closed loop has none: every time is 0."""
    if spec.closed_loop:
        return [0.0] * count
    rng = random.Random(spec.seed)
    scale = 1.0 / (spec.request_rate * spec.burstiness)
    out, t = [], 0.0
    for _ in range(count):
        out.append(t)
        t += rng.gammavariate(spec.burstiness, scale)
    return out


def check_context(
    spec: LoadSpec, model: str, max_len: int | None, requests: list[Request] | None = None
) -> None:
    """Every request whose prompt is token ids (synthetic ones, of `prompt_len`) must fit the model's context with
    the tokens it asks for, or the server refuses it (HTTP 400, `context_length_exceeded`): say so before sending
    any. A text prompt's token count is the server's to know, so it is not checked here."""
    if max_len is None:
        return
    takes = f"{model!r} takes {max_len} (max_model_len at /v1/models); nothing was sent"
    if spec.turns or not spec.prompts_file:
        need, words = _synthetic_need(spec)
        if need > max_len:
            raise ContextTooLong(f"{words}, but {takes}")
        return
    for r in requests or []:
        if isinstance(r.prompt, list) and len(r.prompt) + r.output_len > max_len:
            raise ContextTooLong(
                f"{spec.prompts_file}: a prompt of {len(r.prompt)} token ids and output_len {r.output_len} need "
                f"{len(r.prompt) + r.output_len} tokens of context, but {takes}"
            )


def _synthetic_need(spec: LoadSpec) -> tuple[int, str]:
    """The context a synthetic load's longest request needs, and that in words."""
    if spec.turns:
        need = spec.system_len + spec.turns * (spec.prompt_len + spec.output_len)
        return need, (
            f"{spec.turns} turns of --prompt-len {spec.prompt_len} and --output-len {spec.output_len} after a "
            f"system prompt of {spec.system_len} need {need} tokens of context by the last turn"
        )
    if spec.shared_prefix_len:
        need = spec.shared_prefix_len + spec.prompt_len + spec.output_len
        return need, (
            f"--shared-prefix-len {spec.shared_prefix_len}, --prompt-len {spec.prompt_len} and --output-len "
            f"{spec.output_len} need {need} tokens of context"
        )
    need = spec.prompt_len + spec.output_len
    return (
        need,
        f"--prompt-len {spec.prompt_len} and --output-len {spec.output_len} need {need} tokens of context",
    )
