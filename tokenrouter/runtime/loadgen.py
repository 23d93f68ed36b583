"""`tokenrouter bench`: an async load generator for any OpenAI-compatible completions endpoint.

A closed loop of `concurrency` workers sends `num_prompts` streamed `/v1/completions` requests (synthetic token-id
prompts or prompts from a file), each asking for a fixed number of tokens (`ignore_eos`), and measures per
request: time to first token (TTFT), time per output token after the first (TPOT), end-to-end latency, tokens,
and — when the server is TokenRouter — the `routing` field (tokens written per model, hops). It reports decode
throughput (output tokens / wall time) and latency percentiles, as a table and as JSON.
"""

from __future__ import annotations

import asyncio
import json
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
    concurrency: int = 4
    num_prompts: int = 32
    output_len: int = 128
    prompt_len: int = 32
    prompts_file: str | None = None  # one prompt per line (text)
    ignore_eos: bool = True
    temperature: float = 0.0
    seed: int = 0
    api_key: str | None = None
    timeout_s: float = 600.0
    vocab_low: int = 10  # synthetic prompts draw token ids in [vocab_low, vocab_high)
    vocab_high: int = 200
    progress: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len}")
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {self.prompt_len}")
        if self.prompts_file is not None and not Path(self.prompts_file).is_file():
            raise ValueError(f"prompts file not found: {self.prompts_file}")
        if not 0 <= self.vocab_low < self.vocab_high:
            raise ValueError("need 0 <= vocab_low < vocab_high")


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


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def make_prompts(spec: LoadSpec) -> list[str | list[int]]:
    if spec.prompts_file:
        lines = [ln for ln in Path(spec.prompts_file).read_text().splitlines() if ln.strip()]
        if not lines:
            raise ValueError(f"prompts file has no prompts: {spec.prompts_file}")
        return [lines[i % len(lines)] for i in range(spec.num_prompts)]
    rng = random.Random(spec.seed)
    return [
        [rng.randrange(spec.vocab_low, spec.vocab_high) for _ in range(spec.prompt_len)]
        for _ in range(spec.num_prompts)
    ]


def _merge_routing(result: RequestResult, routing: dict | None) -> None:
    if not routing:
        return
    for name, n in (routing.get("tokens_per_model") or {}).items():
        result.tokens_per_model[name] = result.tokens_per_model.get(name, 0) + int(n)
    result.hops += int(routing.get("hops") or 0)


async def _one_request(
    client: httpx.AsyncClient, spec: LoadSpec, model: str, prompt, index: int
) -> RequestResult:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": spec.output_len,
        "temperature": spec.temperature,
        "seed": spec.seed + index,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": spec.ignore_eos,
    }
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


class ContextTooLong(ValueError):
    """The load's prompts and output tokens do not fit the served model's context: nothing was sent."""


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
    limit = (card or {}).get("max_model_len")
    return (model or card["id"]), (limit if isinstance(limit, int) and not isinstance(limit, bool) else None)


def check_context(spec: LoadSpec, model: str, max_len: int | None) -> None:
    """Synthetic prompts of `prompt_len` tokens with `output_len` more must fit the model's context, or the
    server refuses every request (HTTP 400, `context_length_exceeded`): say so before sending any. A prompts
    file's token counts are the server's to know, so it is not checked here."""
    need = spec.prompt_len + spec.output_len
    if max_len is not None and not spec.prompts_file and need > max_len:
        raise ContextTooLong(
            f"--prompt-len {spec.prompt_len} and --output-len {spec.output_len} need {need} tokens of context, but "
            f"{model!r} takes {max_len} (max_model_len at /v1/models); nothing was sent"
        )


async def run_load(spec: LoadSpec) -> dict:
    """Run the load and return the report (see `summarize`)."""
    prompts = make_prompts(spec)
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    limits = httpx.Limits(max_connections=spec.concurrency + 4)
    async with httpx.AsyncClient(
        base_url=spec.url, headers=headers, timeout=spec.timeout_s, limits=limits
    ) as client:
        model, max_len = await _resolve_model(client, spec.model)
        check_context(spec, model, max_len)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(prompts)):
            queue.put_nowait(i)
        results: list[RequestResult | None] = [None] * len(prompts)
        done = 0

        async def worker() -> None:
            nonlocal done
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                sent = time.perf_counter() - start
                results[i] = await _one_request(client, spec, model, prompts[i], i)
                results[i].start_s = sent
                done += 1
                if spec.progress:
                    _progress(done, len(prompts))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
        wall = time.perf_counter() - start
    return summarize(spec, model, [r for r in results if r is not None], wall)


def summarize(spec: LoadSpec, model: str, results: list[RequestResult], wall_s: float) -> dict:
    """The report: totals, percentiles, and `per_request` (each request's own record, in prompt order).
    `drain_s` is the time from the last request's send to the end of the run, when fewer than the
    concurrency may be in flight: the part of `wall_s` that a steady-state model does not describe."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    tpots = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    per_model: dict[str, int] = {}
    for r in ok:
        for name, n in r.tokens_per_model.items():
            per_model[name] = per_model.get(name, 0) + n
    return {
        "url": spec.url,
        "model": model,
        "spec": asdict(spec) | {"api_key": None},
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "wall_s": wall_s,
        "output_tokens": out_tokens,
        "decode_throughput_tok_s": out_tokens / wall_s if wall_s > 0 else 0.0,
        "ttft_ms": {
            "p50": 1e3 * _percentile([r.ttft_s for r in ok], 0.5),
            "p99": 1e3 * _percentile([r.ttft_s for r in ok], 0.99),
        },
        "tpot_ms": {"p50": 1e3 * _percentile(tpots, 0.5), "p99": 1e3 * _percentile(tpots, 0.99)},
        "e2e_s": {
            "p50": _percentile([r.e2e_s for r in ok], 0.5),
            "p99": _percentile([r.e2e_s for r in ok], 0.99),
        },
        "tokens_per_model": per_model,
        "share_per_request": share_spread(ok, per_model),
        "hops": sum(r.hops for r in ok),
        "drain_s": wall_s - max((r.start_s for r in results), default=0.0),
        "per_request": [
            {
                "ok": r.ok,
                "start_s": r.start_s,
                "ttft_s": r.ttft_s,
                "e2e_s": r.e2e_s,
                "output_tokens": r.output_tokens,
                "tokens_per_model": r.tokens_per_model,
                "hops": r.hops,
            }
            for r in results
        ],  # fmt: skip
    }


def share_spread(ok: list[RequestResult], per_model: dict[str, int]) -> dict[str, dict]:
    """Per model (when more than one wrote tokens): how its share of a request's tokens is spread over the
    requests: how many requests it wrote any token of, and the p50 / p99 / max of its share. Routing that
    fires on a few requests only (a heavy tail the throughput model, which assumes alike requests, cannot
    see: docs/matrix.md, run 31) shows here as a low p50 and a high max."""
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
    rows = [
        ("requests (ok / failed)", f"{report['completed']} / {report['failed']}"),
        ("wall time (s)", f"{report['wall_s']:.2f}"),
        ("output tokens", f"{report['output_tokens']}"),
        ("decode throughput (tok/s)", f"{report['decode_throughput_tok_s']:.1f}"),
        ("TTFT p50 / p99 (ms)", f"{report['ttft_ms']['p50']:.1f} / {report['ttft_ms']['p99']:.1f}"),
        ("TPOT p50 / p99 (ms)", f"{report['tpot_ms']['p50']:.2f} / {report['tpot_ms']['p99']:.2f}"),
        ("E2E p50 / p99 (s)", f"{report['e2e_s']['p50']:.2f} / {report['e2e_s']['p99']:.2f}"),
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
    width = max(len(k) for k, _ in rows)
    lines = [f"| {'metric'.ljust(width)} | value |", f"| {'-' * width} | ----- |"]
    lines += [f"| {k.ljust(width)} | {v} |" for k, v in rows]
    if report["errors"]:
        lines.append("errors: " + "; ".join(report["errors"]))
    return "\n".join(lines)
