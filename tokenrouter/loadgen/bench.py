"""`tokenrouter bench`: an async load generator for any OpenAI-compatible completions endpoint.

It sends `num_prompts` streamed `/v1/completions` requests (synthetic token-id prompts or prompts from a file),
each asking for a fixed number of tokens (`ignore_eos`), in one of two loads:
- a closed loop (the default): `concurrency` workers, each sending its next request when its last one ends;
- an open loop (`request_rate` requests per second): requests arrive on their own clock, gamma-distributed
  gaps of mean 1 / rate (`burstiness` is the shape: 1 is a Poisson process, below 1 burstier), at most
  `concurrency` in flight where it is given; a request that arrives at the cap waits for a free place, and that
  wait is reported apart (`queued_ms`), not in its latency.
`warmup` requests go first, one round at the load's concurrency, and are not counted.

Per request it measures time to first token (TTFT), time per output token after the first (TPOT), end-to-end
latency, tokens, and — when the server is TokenRouter — the `routing` field (tokens written per model, hops).
It reports decode throughput (output tokens / wall time), request throughput and latency percentiles, as a table
and as JSON.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx


@dataclass(slots=True)
class LoadSpec:
    url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: the first id that /v1/models lists
    concurrency: int | None = 4  # requests in flight at most; None: no cap (an open loop only)
    request_rate: float = math.inf  # requests per second; inf: a closed loop of `concurrency` workers
    burstiness: float = 1.0  # the gamma shape of an open loop's gaps between arrivals (1: Poisson)
    warmup: int = 0  # requests sent before the measured ones, not counted
    # service-level objectives: a request meets them when its TTFT and its TPOT are within these (None: no
    # bound); the report's goodput counts the requests that do
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    num_prompts: int = 32
    output_len: int = 128
    prompt_len: int = 32
    prompts_file: str | None = None  # one prompt a line (text), or JSON lines (`.jsonl`): read_prompts_file
    ignore_eos: bool = True
    temperature: float = 0.0
    seed: int = 0
    api_key: str | None = None
    timeout_s: float = 600.0
    vocab_low: int = 10  # synthetic prompts draw token ids in [vocab_low, vocab_high)
    vocab_high: int = 200
    progress: bool = True
    # prefix workloads (workloads.py): a shared prefix of this many synthetic tokens in each of `prefix_groups`
    # groups before each prompt's own `prompt_len`; or conversations of `turns` turns (num_prompts of them), a
    # shared system prompt of `system_len` tokens, user messages of `prompt_len`, a think time between turns
    shared_prefix_len: int = 0
    prefix_groups: int = 1
    turns: int = 0
    system_len: int = 0
    think_time_s: float = 0.0
    conversation_file: bool = False  # set from the prompts file: its lines are conversations (workloads.py)

    def __post_init__(self) -> None:
        # the server's base URL; an OpenAI client's base URL ends in /v1, which the paths here already have
        self.url = self.url.rstrip("/").removesuffix("/v1")
        if self.concurrency is None and self.closed_loop:
            raise ValueError("a closed loop needs a concurrency; give a request rate for an open loop")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not self.request_rate > 0:  # NaN too
            raise ValueError(f"request rate must be > 0 requests per second, got {self.request_rate}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be a finite number > 0, got {self.burstiness}")
        if self.closed_loop and self.burstiness != 1.0:
            raise ValueError("burstiness shapes an open loop's arrivals: give a request rate with it")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        for name in ("slo_ttft_ms", "slo_tpot_ms"):
            bound = getattr(self, name)
            if bound is not None and not (bound > 0 and math.isfinite(bound)):
                raise ValueError(f"{name} must be a finite number of ms > 0, got {bound}")
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len}")
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {self.prompt_len}")
        if self.prompts_file is not None and not Path(self.prompts_file).is_file():
            what = "is a folder" if Path(self.prompts_file).is_dir() else "not found"
            raise ValueError(f"prompts file {what}: {self.prompts_file}")
        if self.prompts_file is not None:
            from tokenrouter.loadgen.workloads import is_conversation_file

            self.conversation_file = is_conversation_file(self.prompts_file)
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 <= self.vocab_low < self.vocab_high:
            raise ValueError("need 0 <= vocab_low < vocab_high")
        for name in ("shared_prefix_len", "turns", "system_len"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.prefix_groups < 1:
            raise ValueError(f"prefix_groups must be >= 1, got {self.prefix_groups}")
        if not (math.isfinite(self.think_time_s) and self.think_time_s >= 0):
            raise ValueError(f"think time must be a finite number of seconds >= 0, got {self.think_time_s}")
        if self.turns and self.shared_prefix_len:
            raise ValueError("give a shared prefix or conversations (--turns), not both")
        if (self.system_len or self.think_time_s) and not self.conversations:
            raise ValueError("--system-len and --think-time shape conversations: give --turns with them")
        if (self.shared_prefix_len or self.prefix_groups > 1 or self.turns) and self.prompts_file:
            raise ValueError(
                "a prompts file gives its own prompts: no --shared-prefix-len, --prefix-groups or --turns"
            )
        if self.conversations and not self.closed_loop:
            raise ValueError("conversations run as a closed loop: give --concurrency, not --request-rate")

    @property
    def closed_loop(self) -> bool:
        return math.isinf(self.request_rate)

    @property
    def conversations(self) -> bool:
        """Whether the load is conversations (`--turns`, or a conversations file)."""
        return self.turns > 0 or self.conversation_file

    def describe(self) -> str:
        """The load in words, as the report's table heads it."""
        if self.conversations:
            what = (
                f"{self.turns} turns, system prompt {self.system_len}" if self.turns else "conversations file"
            )
            return f"{self.num_prompts} conversations ({what}), {self.concurrency} at once"
        if self.shared_prefix_len:
            shared = f", a {self.shared_prefix_len}-token prefix shared in {self.prefix_groups} group(s)"
        else:
            shared = ""
        if self.closed_loop:
            return f"closed loop, {self.concurrency} in flight{shared}"
        kind = "Poisson" if self.burstiness == 1.0 else f"gamma gaps, burstiness {self.burstiness:g}"
        cap = f"at most {self.concurrency} in flight" if self.concurrency else "no cap on requests in flight"
        return f"open loop, {self.request_rate:g} requests/s ({kind}), {cap}"


@dataclass(slots=True)
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    tokens_per_model: dict[str, int] = field(default_factory=dict)
    hops: int = 0
    error: str | None = None
    start_s: float = 0.0  # when it was sent, seconds after the run's start
    queued_s: float = 0.0  # an open loop's wait at the concurrency cap, from its arrival to its send
    text: str = ""  # the completion's text
    token_ids: list[int] | None = None  # its token ids, where the server returned them (`return_token_ids`)
    conversation: int = -1  # a conversation load's: which conversation, and which turn (from 1)
    turn: int = 0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass(frozen=True, slots=True)
class Request:
    """One request of the load: its prompt (text, or token ids) and the tokens it asks for (`max_tokens`)."""

    prompt: str | list[int]
    output_len: int


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


def _merge_routing(result: RequestResult, routing: dict | None) -> None:
    if not routing:
        return
    if isinstance(routing.get("token_ids"), list):
        result.token_ids = [int(t) for t in routing["token_ids"]]
    for name, n in (routing.get("tokens_per_model") or {}).items():
        result.tokens_per_model[name] = result.tokens_per_model.get(name, 0) + int(n)
    result.hops += int(routing.get("hops") or 0)


async def _one_request(
    client: httpx.AsyncClient, spec: LoadSpec, model: str, request: Request, seed: int
) -> RequestResult:
    body = {
        "model": model,
        "prompt": request.prompt,
        "max_tokens": request.output_len,
        "temperature": spec.temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": spec.ignore_eos,
    }
    if spec.conversations:  # the next turn re-sends the answer: exactly, where the server returns its ids
        body["return_token_ids"] = True
    result = RequestResult(ok=False)
    start = time.perf_counter()
    first = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {text[:300]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = str(chunk["error"])
                    return result
                for choice in chunk.get("choices") or []:
                    # the first chunk that carries tokens (its text may be empty: a token that is not
                    # yet decodable text, as with the random-weight models' small tokenizers)
                    if first is None and choice.get("finish_reason") is None and "text" in choice:
                        first = time.perf_counter()
                    result.text += choice.get("text") or ""
                    _merge_routing(result, choice.get("routing"))
                usage = chunk.get("usage")
                if usage:
                    result.output_tokens = int(usage.get("completion_tokens") or 0)
                    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    end = time.perf_counter()
    result.ok = True
    result.e2e_s = end - start
    result.ttft_s = (first if first is not None else end) - start
    return result


def _progress(done: int, total: int) -> None:
    width = 30
    filled = width * done // total
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


class LoadRefused(ValueError):
    """The load cannot be served as asked (the message says why); nothing was sent."""


class ContextTooLong(LoadRefused):
    """The load's prompts and output tokens do not fit the served model's context."""


async def _resolve_model(client: httpx.AsyncClient, model: str | None) -> tuple[str, int | None]:
    """The model to ask for (`model`, else the first id /v1/models lists) and its context length as the server
    lists it (`max_model_len`; None where it does not, or where a given model's listing cannot be read)."""
    resp = await client.get("/v1/models")
    if model and resp.status_code != 200:  # a server without the listing can still be asked for a named model
        return model, None
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data and not model:
        raise RuntimeError("the server lists no models at /v1/models")
    card = next((c for c in data if c.get("id") == model), None) if model else data[0]
    if model and data and card is None:
        served = ", ".join(repr(c.get("id")) for c in data)
        raise LoadRefused(f"model {model!r} is not served here (/v1/models lists {served}); nothing was sent")
    limit = (card or {}).get("max_model_len")
    return (model or card["id"]), (limit if isinstance(limit, int) and not isinstance(limit, bool) else None)


def check_context(
    spec: LoadSpec, model: str, max_len: int | None, requests: list[Request] | None = None
) -> None:
    """Every request whose prompt is token ids (synthetic ones, of `prompt_len`) must fit the model's context with
    the tokens it asks for, or the server refuses it (HTTP 400, `context_length_exceeded`): say so before sending
    any. A text prompt's token count is the server's to know, so it is not checked here."""
    if max_len is None:
        return
    if spec.turns:
        need = spec.system_len + spec.turns * (spec.prompt_len + spec.output_len)
        if need > max_len:
            raise ContextTooLong(
                f"{spec.turns} turns of --prompt-len {spec.prompt_len} and --output-len {spec.output_len} after a "
                f"system prompt of {spec.system_len} need {need} tokens of context by the last turn, but {model!r} "
                f"takes {max_len} (max_model_len at /v1/models); nothing was sent"
            )
        return
    if spec.shared_prefix_len and not spec.prompts_file:
        need = spec.shared_prefix_len + spec.prompt_len + spec.output_len
        if need > max_len:
            raise ContextTooLong(
                f"--shared-prefix-len {spec.shared_prefix_len}, --prompt-len {spec.prompt_len} and --output-len "
                f"{spec.output_len} need {need} tokens of context, but {model!r} takes {max_len} (max_model_len at "
                "/v1/models); nothing was sent"
            )
        return
    if not spec.prompts_file:
        need = spec.prompt_len + spec.output_len
        if need > max_len:
            raise ContextTooLong(
                f"--prompt-len {spec.prompt_len} and --output-len {spec.output_len} need {need} tokens of context, "
                f"but {model!r} takes {max_len} (max_model_len at /v1/models); nothing was sent"
            )
        return
    for r in requests or []:
        if isinstance(r.prompt, list) and len(r.prompt) + r.output_len > max_len:
            raise ContextTooLong(
                f"{spec.prompts_file}: a prompt of {len(r.prompt)} token ids and output_len {r.output_len} need "
                f"{len(r.prompt) + r.output_len} tokens of context, but {model!r} takes {max_len} (max_model_len at "
                "/v1/models); nothing was sent"
            )


async def run_load(spec: LoadSpec) -> dict:
    """Run the load and return the report (see `summarize`)."""
    requests = make_requests(spec)
    warm_requests = warmup_requests(spec)
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    in_flight = spec.concurrency if spec.concurrency is not None else spec.num_prompts
    limits = httpx.Limits(max_connections=in_flight + 4)
    async with httpx.AsyncClient(
        base_url=spec.url, headers=headers, timeout=spec.timeout_s, limits=limits
    ) as client:
        model, max_len = await _resolve_model(client, spec.model)
        check_context(spec, model, max_len, requests + warm_requests)
        warm: list[RequestResult] = []
        if spec.warmup:
            warm = await _closed_loop(client, spec, model, warm_requests, spec.concurrency or spec.warmup,
                                      seed_base=spec.seed + spec.num_prompts, progress=False)  # fmt: skip
        from tokenrouter.loadgen.workloads import (
            hit_rates,
            prefix_counters,
            run_conversations,
            settled_counters,
        )

        before = await prefix_counters(client)
        counter = _InFlight()
        if spec.conversations:

            def progress(done: int, total: int) -> None:
                if spec.progress:
                    _progress(done, total)

            async def one(request: Request, seed: int) -> RequestResult:
                counter.enter()
                try:
                    return await _one_request(client, spec, model, request, seed)
                finally:
                    counter.leave()

            run = run_conversations(one, Request, make_conversations(spec), spec.concurrency,
                                    spec.think_time_s, spec.seed, progress)  # fmt: skip
        elif spec.closed_loop:
            run = _closed_loop(
                client, spec, model, requests, spec.concurrency, spec.seed, spec.progress, counter
            )
        else:
            run = _open_loop(client, spec, model, requests, counter)
        start = time.perf_counter()
        results = await run
        wall = time.perf_counter() - start
        after = await settled_counters(client) if before is not None else None
    report = summarize(spec, model, results, wall)
    if rates := hit_rates(before, after):
        report["prefix_cache"] = rates
    report["max_in_flight"] = counter.peak
    report["warmup"] = {
        "requests": len(warm),
        "failed": sum(1 for r in warm if not r.ok),
        "errors": sorted({r.error for r in warm if r.error})[:5],
    }
    return report


class _InFlight:
    """Requests in flight now, and the most at once."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        self.now -= 1


async def _closed_loop(
    client: httpx.AsyncClient,
    spec: LoadSpec,
    model: str,
    requests: list[Request],
    workers: int,
    seed_base: int,
    progress: bool,
    counter: _InFlight | None = None,
) -> list[RequestResult]:
    """`workers` workers take the requests in order, each sending its next when its last one has ended."""
    counter = counter or _InFlight()
    queue = iter(range(len(requests)))
    results: list[RequestResult | None] = [None] * len(requests)
    done = 0
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal done
        for i in queue:  # one iterator shared by every worker: each index is taken once
            sent = time.perf_counter() - start
            counter.enter()
            try:
                results[i] = await _one_request(client, spec, model, requests[i], seed_base + i)
            finally:
                counter.leave()
            results[i].start_s = sent
            done += 1
            if progress:
                _progress(done, len(requests))

    await asyncio.gather(*(worker() for _ in range(min(workers, len(requests)))))
    return [r for r in results if r is not None]


async def _open_loop(
    client: httpx.AsyncClient, spec: LoadSpec, model: str, requests: list[Request], counter: _InFlight
) -> list[RequestResult]:
    """Each request is sent at its arrival time (`arrival_times`), or, at the concurrency cap, when a place
    frees; the wait at the cap is its `queued_s`."""
    arrivals = arrival_times(spec, len(requests))
    cap = asyncio.Semaphore(spec.concurrency) if spec.concurrency is not None else None
    done = 0
    start = time.perf_counter()

    async def one(i: int) -> RequestResult:
        nonlocal done
        await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
        arrived = time.perf_counter()
        if cap is not None:
            await cap.acquire()
        try:
            sent = time.perf_counter()
            counter.enter()
            try:
                result = await _one_request(client, spec, model, requests[i], spec.seed + i)
            finally:
                counter.leave()
        finally:
            if cap is not None:
                cap.release()
        result.start_s = sent - start
        result.queued_s = sent - arrived if cap is not None else 0.0
        done += 1
        if spec.progress:
            _progress(done, len(requests))
        return result

    return list(await asyncio.gather(*(one(i) for i in range(len(requests)))))


def summarize(spec: LoadSpec, model: str, results: list[RequestResult], wall_s: float) -> dict:
    """The report: totals, percentiles, and `per_request` (each request's own record, in prompt order).
    `drain_s` is the time from the last request's send to the end of the run, when fewer than the
    concurrency may be in flight: the part of `wall_s` that a steady-state model does not describe.
    `queued_ms` (an open loop's) is the wait of a request that arrived at the concurrency cap."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    tpots = [_tpot_s(r) for r in ok if r.output_tokens > 1]
    per_model: dict[str, int] = {}
    for r in ok:
        for name, n in r.tokens_per_model.items():
            per_model[name] = per_model.get(name, 0) + n
    return {
        "url": spec.url,
        "model": model,
        # a closed loop's rate (inf) is written null: JSON has no infinity
        "spec": asdict(spec)
        | {"api_key": None, "request_rate": None if spec.closed_loop else spec.request_rate},
        "load": spec.describe(),
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "wall_s": wall_s,
        "output_tokens": out_tokens,
        "prompt_tokens": prompt_tokens,
        "decode_throughput_tok_s": out_tokens / wall_s if wall_s > 0 else 0.0,
        "total_throughput_tok_s": (out_tokens + prompt_tokens) / wall_s if wall_s > 0 else 0.0,
        "request_throughput_req_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        **_goodput(spec, ok, len(results), wall_s),
        "ttft_ms": _spread([1e3 * r.ttft_s for r in ok]),
        "tpot_ms": _spread([1e3 * t for t in tpots]),
        "e2e_s": _spread([r.e2e_s for r in ok]),
        "queued_ms": _spread([1e3 * r.queued_s for r in results]),
        # what the client waited in all: from the request's arrival (its wait at the cap included) to its end
        "from_arrival_s": _spread([r.queued_s + r.e2e_s for r in ok]),
        "tokens_per_model": per_model,
        "share_per_request": share_spread(ok, per_model),
        "hops": sum(r.hops for r in ok),
        "drain_s": wall_s - max((r.start_s for r in results), default=0.0),
        **_by_turn(ok),
        "per_request": [
            {
                "ok": r.ok,
                "start_s": r.start_s,
                "queued_s": r.queued_s,
                "ttft_s": r.ttft_s,
                "e2e_s": r.e2e_s,
                "output_tokens": r.output_tokens,
                "tokens_per_model": r.tokens_per_model,
                "hops": r.hops,
                **({"conversation": r.conversation, "turn": r.turn} if r.turn else {}),
            }
            for r in results
        ],  # fmt: skip
    }


def _by_turn(ok: list[RequestResult]) -> dict:
    """A conversation load's TTFT by turn (mean, p50, p99 in ms; keys are turn numbers as strings)."""
    turns = sorted({r.turn for r in ok if r.turn})
    if not turns:
        return {}
    return {"ttft_ms_by_turn": {str(k): _spread([1e3 * r.ttft_s for r in ok if r.turn == k]) for k in turns}}


def _tpot_s(r: RequestResult) -> float:
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0


def _goodput(spec: LoadSpec, ok: list[RequestResult], sent: int, wall_s: float) -> dict:
    """With service-level objectives: the requests that completed within both (`slo_met`, of all sent) and
    those per second (`goodput_req_s`). A one-token request has no TPOT to miss."""
    if spec.slo_ttft_ms is None and spec.slo_tpot_ms is None:
        return {}
    ttft, tpot = spec.slo_ttft_ms or math.inf, spec.slo_tpot_ms or math.inf
    met = sum(1 for r in ok if 1e3 * r.ttft_s <= ttft and 1e3 * _tpot_s(r) <= tpot)
    return {
        "slo": {"ttft_ms": spec.slo_ttft_ms, "tpot_ms": spec.slo_tpot_ms},
        "slo_met": met,
        "slo_met_share": met / sent if sent else 0.0,
        "goodput_req_s": met / wall_s if wall_s > 0 else 0.0,
    }


def write_report(report: dict, path: str | Path) -> None:
    """The report as JSON, a NaN (a percentile of nothing: every request failed) or infinity written as null,
    which JSON readers other than Python's accept."""
    from tokenrouter.outfile import finite_json, write_replacing

    write_replacing(path, json.dumps(finite_json(report), indent=2) + "\n")


def _spread(values: list[float]) -> dict[str, float]:
    """Mean, p50 and p99 (NaN for no values)."""
    mean = sum(values) / len(values) if values else float("nan")
    return {"mean": mean, "p50": _percentile(values, 0.5), "p99": _percentile(values, 0.99)}


def share_spread(ok: list[RequestResult], per_model: dict[str, int]) -> dict[str, dict]:
    """Per model (when more than one wrote tokens): how its share of a request's tokens is spread over the
    requests: how many requests it wrote any token of, and the p50 / p99 / max of its share. Routing that
    fires on a few requests only (a heavy tail the throughput model, which assumes alike requests, cannot
    see) shows here as a low p50 and a high max."""
    if len(per_model) < 2:
        return {}
    out = {}
    for name in sorted(per_model):
        shares = [
            r.tokens_per_model.get(name, 0) / total
            for r in ok
            if (total := sum(r.tokens_per_model.values())) > 0
        ]
        out[name] = {
            "requests_with_any": sum(1 for x in shares if x > 0),
            "requests": len(shares),
            "p50": _percentile(shares, 0.5),
            "p99": _percentile(shares, 0.99),
            "max": max(shares, default=float("nan")),
        }
    return out


def format_report(report: dict) -> str:
    ttft, tpot, e2e = report["ttft_ms"], report["tpot_ms"], report["e2e_s"]
    rows = [
        ("load", report.get("load", "")),
        ("requests (ok / failed)", f"{report['completed']} / {report['failed']}"),
        ("wall time (s)", f"{report['wall_s']:.2f}"),
        ("output tokens", f"{report['output_tokens']}"),
        ("decode throughput (tok/s)", f"{report['decode_throughput_tok_s']:.1f}"),
        ("request throughput (req/s)", f"{report.get('request_throughput_req_s', 0.0):.2f}"),
        (
            "TTFT mean / p50 / p99 (ms)",
            f"{ttft.get('mean', math.nan):.1f} / {ttft['p50']:.1f} / {ttft['p99']:.1f}",
        ),
        (
            "TPOT mean / p50 / p99 (ms)",
            f"{tpot.get('mean', math.nan):.2f} / {tpot['p50']:.2f} / {tpot['p99']:.2f}",
        ),
        (
            "E2E mean / p50 / p99 (s)",
            f"{e2e.get('mean', math.nan):.2f} / {e2e['p50']:.2f} / {e2e['p99']:.2f}",
        ),
    ]
    if "slo" in report:
        bounds = [f"{k.split('_')[0].upper()} <= {v:g} ms" for k, v in report["slo"].items() if v is not None]
        rows.append(
            (
                f"within the SLO ({', '.join(bounds)})",
                f"{report['slo_met']} of {report['requests']} ({100 * report['slo_met_share']:.1f}%), "
                f"goodput {report['goodput_req_s']:.2f} req/s",
            )
        )
    queued = report.get("queued_ms")
    if queued and (report.get("spec") or {}).get("request_rate") is not None:
        rows.append(("queued at the cap p50 / p99 (ms)", f"{queued['p50']:.1f} / {queued['p99']:.1f}"))
        if arrival := report.get("from_arrival_s"):
            rows.append(("from arrival to end p50 / p99 (s)", f"{arrival['p50']:.2f} / {arrival['p99']:.2f}"))
    if "max_in_flight" in report:
        rows.append(("most requests in flight", f"{report['max_in_flight']}"))
    rows += [
        ("hops", f"{report['hops']}"),
        ("drain after the last send (s)", f"{report['drain_s']:.2f}"),
    ]
    total = sum(report["tokens_per_model"].values())
    for name, n in sorted(report["tokens_per_model"].items()):
        rows.append((f"tokens by {name}", f"{n} ({100.0 * n / total:.1f}%)" if total else str(n)))
    for name, sp in (report.get("share_per_request") or {}).items():
        rows.append(
            (
                f"{name}'s share of a request p50 / p99 / max",
                f"{100 * sp['p50']:.1f} / {100 * sp['p99']:.1f} / {100 * sp['max']:.1f}% "
                f"(any in {sp['requests_with_any']} of {sp['requests']})",
            )
        )
    for turn, sp in (report.get("ttft_ms_by_turn") or {}).items():
        rows.append((f"TTFT of turn {turn} p50 / p99 (ms)", f"{sp['p50']:.1f} / {sp['p99']:.1f}"))
    for name, pc in (report.get("prefix_cache") or {}).items():
        value = (
            f"{100 * pc['hit_rate']:.1f}% ({pc['matched_tokens']} matched / {pc['computed_tokens']} computed)"
            if pc["enabled"]
            else "off"
        )
        rows.append((f"prefix cache hits on {name}", value))
    warm = report.get("warmup") or {}
    if warm.get("requests"):
        rows.append(("warm-up requests (not counted)", f"{warm['requests']} ({warm['failed']} failed)"))
    rows = [("metric", "value"), *((k, str(v)) for k, v in rows)]
    width, value_width = (max(len(row[i]) for row in rows) for i in (0, 1))
    lines = [f"| {k.ljust(width)} | {v.ljust(value_width)} |" for k, v in rows]
    lines.insert(1, f"| {'-' * width} | {'-' * value_width} |")
    if report["errors"]:
        lines.append("errors: " + "; ".join(report["errors"]))
    if warm.get("errors"):
        lines.append("warm-up errors: " + "; ".join(warm["errors"]))
    return "\n".join(lines)
