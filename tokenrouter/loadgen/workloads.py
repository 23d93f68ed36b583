"""`tokenrouter bench`'s prefix workloads: shared-prefix loads, multi-turn conversations, and the prefix cache's
hit rate read from the server's /metrics.

- **Shared prefix** (`--shared-prefix-len S --prefix-groups G`): request i's prompt is its group's prefix of S
  synthetic tokens (group i mod G) followed by `--prompt-len` tokens of its own.
- **Conversations** (`--turns K`): `--num-prompts` conversations, at most `--concurrency` at once. All share a
  system prompt of `--system-len` tokens; turn 1 sends it plus a user message of `--prompt-len` tokens, and
  each later turn sends the previous turn's prompt, its answer (`--output-len` tokens, as the server generated
  them: TokenRouter returns their ids with `return_token_ids`; from another server, the answer's text is
  tokenized by that server on the next turn) and a new user message, after `--think-time` seconds.
  A `.jsonl` file of lines `{"turns": [USER, ...], "system": TEXT or IDS, "output_len": N}` (each USER a text or a
  list of token ids; `system` and `output_len` optional) gives its own conversations instead.
- **Hit rate**: the `tokenrouter_prefix_*` counters of /metrics before and after the run, per model: tokens
  matched in the cache and computed when requests arrived, and their ratio.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

STATS_PERIOD_S = 0.5  # subservers send their counters to the frontend this often


@dataclass(slots=True)
class Conversation:
    system: list[int] | str
    users: list[list[int] | str]
    output_len: int


def shared_prefix_prompts(spec, count: int, seed: int) -> list[list[int]]:
    """`count` prompts: group i mod G's prefix of `shared_prefix_len` tokens, then `prompt_len` tokens of its own."""
    rng = random.Random(seed)
    draw = lambda n: [rng.randrange(spec.vocab_low, spec.vocab_high) for _ in range(n)]  # noqa: E731
    heads = [draw(spec.shared_prefix_len) for _ in range(spec.prefix_groups)]
    return [heads[i % spec.prefix_groups] + draw(spec.prompt_len) for i in range(count)]


def synthetic_conversations(spec, count: int, seed: int) -> list[Conversation]:
    rng = random.Random(seed)
    draw = lambda n: [rng.randrange(spec.vocab_low, spec.vocab_high) for _ in range(n)]  # noqa: E731
    system = draw(spec.system_len)
    return [
        Conversation(system, [draw(spec.prompt_len) for _ in range(spec.turns)], spec.output_len)
        for _ in range(count)
    ]


def is_conversation_file(path: str | Path) -> bool:
    """Whether a .jsonl prompts file holds conversations (its first object has "turns")."""
    p = Path(path)
    if p.suffix.lower() != ".jsonl":
        return False
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return False  # read_prompts_file says what is wrong with it
    for line in text.splitlines():
        if line.strip():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                return False
            return isinstance(obj, dict) and "turns" in obj
    return False


def _message(value, where: str, what: str, empty_ok: bool = False) -> list[int] | str:
    ids = isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    )
    if isinstance(value, str) or ids:
        if value or empty_ok:
            return value
    raise ValueError(
        f"{where}: {what} must be a {'' if empty_ok else 'non-empty '}string or list of token ids (ints >= 0)"
    )


def read_conversations(path: str | Path, default_len: int) -> list[Conversation]:
    """A conversations file's conversations; a bad line is a ValueError naming the file and line."""
    out = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        out.append(_conversation(line, f"{path}:{number}", default_len))
    if not out:
        raise ValueError(f"prompts file has no conversations: {path}")
    return out


def _conversation(line: str, where: str, default_len: int) -> Conversation:
    """One line of a conversations file; a ValueError naming `where` (FILE:LINE) if it is not one."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not a JSON object: {exc.msg}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("turns"), list) or not obj["turns"]:
        raise ValueError(f'{where}: each line must be a JSON object with a non-empty list "turns"')
    users = [_message(u, where, "each turn") for u in obj["turns"]]
    system = _message(obj.get("system", ""), where, '"system"', empty_ok=True)
    kinds = {type(u) for u in users} | ({type(system)} if system else set())
    if len(kinds) > 1:
        raise ValueError(f"{where}: mixes text and token ids; use one kind in a conversation")
    if not system:
        system = type(users[0])()  # "" or []
    length = obj.get("output_len", default_len)
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ValueError(f'{where}: "output_len" must be an int >= 1, got {length!r}')
    return Conversation(system, users, length)


def next_prompt(prompt, answer_ids: list[int] | None, answer_text: str, user):
    """A later turn's prompt: the previous one, its answer and the new user message, as token ids when the server
    returned the answer's ids, else as text."""
    if isinstance(prompt, list) and answer_ids is not None and isinstance(user, list):
        return prompt + answer_ids + user
    as_text = lambda x: x if isinstance(x, str) else " ".join(map(str, x))  # noqa: E731
    return as_text(prompt) + answer_text + as_text(user)


def first_prompt(conv: Conversation):
    """Turn 1's prompt: the system prompt and the first user message (both text, or both token ids)."""
    return conv.system + conv.users[0]


async def run_conversations(one_request, requests_cls, convs: list[Conversation], workers: int, think_s: float,
                            seed_base: int, progress) -> list:  # fmt: skip
    """Each of `workers` runs one conversation at a time, its turns in order; the results in (conversation,
    turn) order, each with `conversation` and `turn` set."""
    queue = iter(range(len(convs)))
    results: list[list] = [[] for _ in convs]
    total = sum(len(c.users) for c in convs)
    done = 0
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal done
        for i in queue:
            conv = convs[i]
            prompt = first_prompt(conv)
            for k in range(len(conv.users)):
                if k:
                    await asyncio.sleep(think_s)
                    last = results[i][-1]
                    prompt = next_prompt(prompt, last.token_ids, last.text, conv.users[k])
                sent = time.perf_counter() - start
                r = await one_request(requests_cls(prompt, conv.output_len), seed_base + 1000 * i + k)
                r.start_s, r.conversation, r.turn = sent, i, k + 1
                results[i].append(r)
                done += 1
                progress(done, total)
                if not r.ok:
                    break

    await asyncio.gather(*(worker() for _ in range(min(workers, len(convs)))))
    return [r for conv in results for r in conv]


_SAMPLE = re.compile(r'^tokenrouter_(prefix_\w+|steps_total|step_seconds_total|step_rows_total|step_tokens_total)'
                     r'\{model="([^"]*)"\} (\S+)$', re.M)  # fmt: skip


async def server_counters(client: httpx.AsyncClient) -> dict[str, dict[str, float]] | None:
    """The server's tokenrouter_prefix_* gauges and step counters per model, or None where it has no such
    /metrics."""
    try:
        resp = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    out: dict[str, dict[str, float]] = {}
    for name, model, value in _SAMPLE.findall(resp.text):
        out.setdefault(model, {})[name] = float(value)
    return out or None


async def settled_counters(client: httpx.AsyncClient) -> dict[str, dict[str, float]] | None:
    """The counters once the subservers have reported the run's last steps (one stats period later)."""
    await asyncio.sleep(2 * STATS_PERIOD_S)
    return await server_counters(client)


def step_counts(before: dict | None, after: dict | None, wall_s: float) -> dict[str, dict]:
    """Per model, what its subserver ran during the measured run: steps, ms per step (forward and route kernel),
    rows and tokens per step (tokens above rows: prefills and the extends of returning requests), and the share
    of the run's wall time spent in steps."""
    out = {}
    for model, now in sorted((after or {}).items()):
        was = (before or {}).get(model, {})
        d = {k: now.get(k, 0.0) - was.get(k, 0.0) for k in ("steps_total", "step_seconds_total", "step_rows_total",
                                                              "step_tokens_total")}  # fmt: skip
        if "steps_total" not in now or not d["steps_total"]:
            continue
        steps = d["steps_total"]
        out[model] = {
            "steps": int(steps),
            "ms_per_step": 1000.0 * d["step_seconds_total"] / steps,
            "rows_per_step": d["step_rows_total"] / steps,
            "tokens_per_step": d["step_tokens_total"] / steps,
            "busy": d["step_seconds_total"] / wall_s if wall_s > 0 else 0.0,
        }
    return out


def hit_rates(before: dict | None, after: dict | None) -> dict[str, dict]:
    """Per model, over the run: tokens matched in the prefix cache and computed on arrival, and the hit rate
    (matched / both)."""
    if not after:
        return {}
    out = {}
    for model, now in sorted(after.items()):
        was = (before or {}).get(model, {})
        matched = now.get("prefix_matched_tokens", 0.0) - was.get("prefix_matched_tokens", 0.0)
        computed = now.get("prefix_computed_tokens", 0.0) - was.get("prefix_computed_tokens", 0.0)
        out[model] = {
            "enabled": bool(now.get("prefix_cache_enabled", 0.0)),
            "matched_tokens": int(matched),
            "computed_tokens": int(computed),
            "hit_rate": matched / (matched + computed) if matched + computed > 0 else 0.0,
            "cached_tokens": int(now.get("prefix_cached_tokens", 0.0)),
            "evicted_blocks": int(
                now.get("prefix_evicted_blocks", 0.0) - was.get("prefix_evicted_blocks", 0.0)
            ),
        }
    return out
