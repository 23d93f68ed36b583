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

The load's definition is `spec.py`, its requests `prompts.py`, the report `report.py`; this module sends them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx

from tokenrouter.loadgen.prompts import (
    WARMUP_SEED,
    arrival_times,
    check_context,
    make_conversations,
    make_prompts,
    make_requests,
    read_prompts_file,
    warmup_requests,
)
from tokenrouter.loadgen.report import (
    _percentile,
    _spread,
    format_report,
    share_spread,
    summarize,
    write_report,
)
from tokenrouter.loadgen.spec import ContextTooLong, LoadRefused, LoadSpec, Request, RequestResult

# the names `tokenrouter bench`, the benchmarks and the tests import from here
__all__ = [
    "WARMUP_SEED",
    "ContextTooLong",
    "LoadRefused",
    "LoadSpec",
    "Request",
    "RequestResult",
    "_percentile",
    "_spread",
    "arrival_times",
    "check_context",
    "format_report",
    "make_conversations",
    "make_prompts",
    "make_requests",
    "read_prompts_file",
    "run_load",
    "share_spread",
    "summarize",
    "warmup_requests",
    "write_report",
]


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
    body = _body(spec, model, request, seed)
    result = RequestResult(ok=False)
    start = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {text[:300]}"
                return result
            first = await _read_stream(resp, result)
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    if result.error is not None:
        return result
    end = time.perf_counter()
    result.ok = True
    result.e2e_s = end - start
    result.ttft_s = (first if first is not None else end) - start
    return result


def _body(spec: LoadSpec, model: str, request: Request, seed: int) -> dict:
    """A request's /v1/completions body."""
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
    return body


async def _read_stream(resp: httpx.Response, result: RequestResult) -> float | None:
    """Read a streamed completion into `result` (its text, routing, usage, or the error a chunk carries); the
    time its first token arrived (None: no token did)."""
    first = None
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            result.error = str(chunk["error"])
            return first
        first = _read_chunk(chunk, result, first)
    return first


def _read_chunk(chunk: dict, result: RequestResult, first: float | None) -> float | None:
    """One streamed chunk into `result`; the time the first token arrived (now, if this chunk brings it)."""
    for choice in chunk.get("choices") or []:
        # the first chunk that carries tokens (its text may be empty: a token that is not
        # yet decodable text, as with the random-weight models' small tokenizers)
        if first is None and choice.get("finish_reason") is None and "text" in choice:
            first = time.perf_counter()
        result.text += choice.get("text") or ""
        if isinstance(choice.get("token_ids"), list):  # SGLang's and vLLM's `return_token_ids`: this chunk's
            result.token_ids = [*(result.token_ids or []), *map(int, choice["token_ids"])]
        _merge_routing(result, choice.get("routing"))  # TokenRouter's: the whole answer's, in its last chunk
    usage = chunk.get("usage")
    if usage:
        result.output_tokens = int(usage.get("completion_tokens") or 0)
        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    return first


def _progress(done: int, total: int) -> None:
    width = 30
    filled = width * done // total
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


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
        from tokenrouter.loadgen.workloads import hit_rates, server_counters, settled_counters, step_counts

        # settled: the warm-up's last steps reach the frontend's counters before the run is counted from them
        before = await settled_counters(client) if spec.warmup else await server_counters(client)
        counter = _InFlight()
        run = _measured_run(client, spec, model, requests, counter)
        start = time.perf_counter()
        results = await run
        wall = time.perf_counter() - start
        after = await settled_counters(client) if before is not None else None
    report = summarize(spec, model, results, wall)
    if rates := hit_rates(before, after):
        report["prefix_cache"] = rates
    if steps := step_counts(before, after, wall):
        report["steps_by_model"] = steps
    report["max_in_flight"] = counter.peak
    report["warmup"] = _warmup_summary(warm)
    return report


def _warmup_summary(warm: list[RequestResult]) -> dict:
    """The warm-up's requests, failures and (up to five) errors."""
    return {
        "requests": len(warm),
        "failed": sum(1 for r in warm if not r.ok),
        "errors": sorted({r.error for r in warm if r.error})[:5],
    }


def _measured_run(
    client: httpx.AsyncClient, spec: LoadSpec, model: str, requests: list[Request], counter: _InFlight
):
    """The measured part of the load, not yet started: conversations, a closed loop or an open loop."""
    if spec.conversations:
        from tokenrouter.loadgen.workloads import run_conversations

        def progress(done: int, total: int) -> None:
            if spec.progress:
                _progress(done, total)

        async def one(request: Request, seed: int) -> RequestResult:
            counter.enter()
            try:
                return await _one_request(client, spec, model, request, seed)
            finally:
                counter.leave()

        return run_conversations(one, Request, make_conversations(spec), spec.concurrency,
                                 spec.think_time_s, spec.seed, progress)  # fmt: skip
    if spec.closed_loop:
        return _closed_loop(
            client, spec, model, requests, spec.concurrency, spec.seed, spec.progress, counter
        )
    return _open_loop(client, spec, model, requests, counter)


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
