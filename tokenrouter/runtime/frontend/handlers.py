"""The two generation endpoints' work: prompts and sampling settings from a validated body, then the response,
whole or streamed (server-sent events)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.frontend.codec import TemplateError, TextCodec
from tokenrouter.runtime.frontend.config import FrontendArgs
from tokenrouter.runtime.frontend.generation import Choice
from tokenrouter.runtime.frontend.logprobs import chat_logprobs, completion_logprobs
from tokenrouter.runtime.frontend.protocol import APIError
from tokenrouter.runtime.frontend.request_manager import RequestManager

_MASK64 = (1 << 64) - 1
_DISCONNECT_POLL_S = 0.25


# a request body this long or shorter is tokenized on the event loop (GenerationHandler.serve): at the 0.18 µs a
# byte measured for the batch API (0.37 s for 2 MB) that holds the loop under a millisecond, and saves the hop to
# a worker thread
INLINE_BODY_BYTES = 4 << 10


class GenerationHandler:
    """Request handling shared by both generation endpoints: prompts, sampling settings, responses."""

    def __init__(self, args: FrontendArgs, codec: TextCodec) -> None:
        self.args = args
        self.codec = codec
        self.created = int(time.time())

    def max_len(self, mgr: RequestManager) -> int | None:
        """The longest prompt + completion every model accepts (from their Ready info), capped by the plan."""
        lims = [i["max_len"] for i in mgr.ready_models.values() if isinstance(i.get("max_len"), int)]
        if self.args.max_len is not None:
            lims.append(self.args.max_len)
        return min(lims) if lims else None

    def vocab_limit(self, mgr: RequestManager) -> int:
        info = mgr.ready_models.get(self.args.entry) or {}
        return max(self.codec.vocab_size, int(info.get("vocab_size") or 0))

    # ---- turning a body into prompts and sampling settings --------------------------------------------------
    def _prompts(self, req: Any, chat: bool, vocab_limit: int) -> list[list[int]]:
        if chat:
            try:
                ids = self.codec.encode_chat(req.template_messages(), **(req.chat_template_kwargs or {}))
            except TemplateError as e:
                raise APIError(400, str(e), param="messages") from None
            return [ids]
        p = req.prompt
        if isinstance(p, str):
            prompts = self.codec.encode_many([p]) if p else [[]]
        elif not p:
            raise APIError(400, "prompt must not be empty", param="prompt")
        elif isinstance(p[0], int):
            prompts = [list(p)]
        elif isinstance(p[0], str):
            prompts = [ids if x else [] for x, ids in zip(p, self.codec.encode_many(p), strict=True)]
        else:
            prompts = [list(x) for x in p]
        for ids in prompts:
            if not ids:
                raise APIError(400, "prompt must not be empty", param="prompt")
            bad = [t for t in ids if not 0 <= t < vocab_limit]
            if bad:
                raise APIError(
                    400,
                    f"token id {bad[0]} is outside the vocabulary [0, {vocab_limit})",
                    param="prompt",
                )
        return prompts

    def _sampling(self, req: Any, prompt_len: int, chat: bool, max_len: int) -> m.SamplingSpec:
        if prompt_len >= max_len:
            raise APIError(
                400,
                f"the prompt has {prompt_len} tokens, but the model's maximum context length is {max_len} tokens",
                param="messages" if chat else "prompt",
                code="context_length_exceeded",
            )
        max_tokens, field = req.completion_limit()
        if max_tokens is None:
            max_tokens = (max_len - prompt_len) if chat else min(16, max_len - prompt_len)
        if prompt_len + max_tokens > max_len:
            raise APIError(
                400,
                f"this model's maximum context length is {max_len} tokens; you requested {prompt_len + max_tokens} "
                f"tokens ({prompt_len} in the prompt, {field} = {max_tokens} for the completion)",
                param=field,
                code="context_length_exceeded",
            )
        seed = _int64(secrets.randbits(63) if req.seed is None else req.seed)
        stop_ids = list(req.stop_token_ids or ())  # EOS is the model's own (config.json), unless ignore_eos
        return m.SamplingSpec(
            temperature=1.0 if req.temperature is None else float(req.temperature),
            top_k=0 if req.top_k in (None, -1) else req.top_k,
            top_p=1.0 if req.top_p is None else float(req.top_p),
            seed=seed,
            max_tokens=max_tokens,
            stop_token_ids=tuple(stop_ids),
            ignore_eos=req.ignore_eos,
            logprobs=req.logprob_count(),
        )

    # ---- serving ----------------------------------------------------------------------------------------
    async def serve(self, request: Request, req: Any, chat: bool) -> Response:
        mgr: RequestManager = request.app.state.manager
        max_len = self._ready(mgr, req)
        prompts = await self._tokenize(request, req, chat, mgr)
        specs = [self._sampling(req, len(ids), chat, max_len) for ids in prompts]
        choices: list[Choice] = []
        try:
            self._submit(mgr, req, prompts, specs, choices)
            rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
            if req.stream:
                return await self._stream(request, req, chat, rid, choices)
            await _unless_disconnected(request, _run_all(choices))
            return JSONResponse(self._full_body(req, chat, rid, choices))
        except BaseException:  # every error path releases the requests already sent
            for c in choices:
                mgr.abort(c.state.rid)
            raise

    def _ready(self, mgr: RequestManager, req: Any) -> int:
        """The longest prompt + completion the server takes, once it can serve the request's model."""
        if req.model is not None and req.model != self.args.policy:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {self.args.policy!r}",
                           param="model", code="model_not_found")  # fmt: skip
        if mgr.closing is not None:
            raise mgr.closing
        if mgr.fatal is not None:
            raise mgr.fatal_error()
        max_len = self.max_len(mgr)
        if not mgr.is_ready or max_len is None:
            raise APIError(
                503, "the server is still starting; retry when GET /health returns 200", code="starting"
            )
        return max_len

    async def _tokenize(self, request: Request, req: Any, chat: bool, mgr: RequestManager) -> list[list[int]]:
        """Tokenizing (and checking token ids) takes seconds for a prompt of megabytes: off the event loop, so
        that other requests, /health included, are served meanwhile (the tokenizer releases the GIL). A short
        body (INLINE_BODY_BYTES) is tokenized in place."""
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) <= INLINE_BODY_BYTES:
            return self._prompts(req, chat, self.vocab_limit(mgr))
        return await run_in_threadpool(self._prompts, req, chat, self.vocab_limit(mgr))

    def _submit(self, mgr: RequestManager, req: Any, prompts, specs, choices: list[Choice]) -> None:
        """n choices per prompt, choice j seeded seed + j: each equals a request of its own with that seed. Each
        joins `choices` as it is sent (the caller aborts them all on an error)."""
        trace, stream_trace = req.return_routing_trace, req.return_routing_trace and req.stream
        for i, (ids, spec) in enumerate(zip(prompts, specs, strict=True)):
            for j in range(req.n):
                st = mgr.submit(ids, msgspec.structs.replace(spec, seed=_int64(spec.seed + j)))
                choices.append(Choice(mgr, self.codec, st, i * req.n + j, req.stop_strings(), self.args.models,
                                      trace, req.return_token_ids, stream_trace))  # fmt: skip

    def _logprobs(self, req: Any, chat: bool, c: Choice, start: int, offset: int = 0) -> dict | None:
        """The choice's logprobs from its `start`-th token on, in the endpoint's shape; None unless asked."""
        if req.logprob_count() < 0:
            return None
        if chat:
            return chat_logprobs(self.codec, c.logprobs[start:])
        return completion_logprobs(self.codec, c.logprobs[start:], offset)

    def _full_body(self, req: Any, chat: bool, rid: str, choices: list[Choice]) -> dict:
        out = []
        for c in choices:
            d: dict = {
                "index": c.index,
                "finish_reason": c.finish_reason,
                "logprobs": self._logprobs(req, chat, c, 0),
                "routing": c.routing(),
            }
            if chat:
                d["message"] = {"role": "assistant", "content": c.text}
            else:
                d["text"] = c.text
            out.append(d)
        return {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.args.policy,
            "choices": out,
            "usage": _usage(choices, req.n),
        }

    async def _stream(
        self, request: Request, req: Any, chat: bool, rid: str, choices: list[Choice]
    ) -> Response:
        events = _merge(choices)
        # Wait for the first event before sending headers, so that a request that fails before its first token
        # gets a real error status instead of a 200 with an error event.
        try:
            first = await _unless_disconnected(request, events.__anext__())
        except StopAsyncIteration:
            first = None
        except APIError:
            await events.aclose()
            raise
        chunks = _StreamChunks(self, req, chat, rid, int(time.time()), {c.index: (0, 0) for c in choices})
        return StreamingResponse(
            chunks.body(choices, first, events),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )


class _StreamChunks:
    """The server-sent events of one streamed response: a chunk per event of its choices (a piece of text, or a
    choice's end), the usage where asked, and `[DONE]`; an error after the first event as an error event."""

    def __init__(self, handler: GenerationHandler, req: Any, chat: bool, rid: str, created: int,
                 sent: dict[int, tuple[int, int]]) -> None:  # fmt: skip
        self.handler, self.req, self.chat, self.rid, self.created = handler, req, chat, rid, created
        self.sent = sent  # per choice: logprob entries sent, their text's length

    async def body(self, choices: list[Choice], first, events) -> AsyncIterator[str]:
        try:
            if self.chat:
                opening = {
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                yield self.chunk([{"index": c.index, **opening} for c in choices])
            ev = first
            while ev is not None:
                c, text = ev
                yield self.chunk([self.final(c)] if text is None else [self.piece(c, text)])
                ev = await anext(events, None)
            if self.req.include_usage:
                yield self.chunk([], _usage(choices, self.req.n))
            yield "data: [DONE]\n\n"
        except APIError as e:
            yield f"data: {json.dumps(e.body())}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            await events.aclose()

    def chunk(self, choice_list: list[dict], usage: dict | None = None) -> str:
        body: dict = {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.handler.args.policy,
            "choices": choice_list,
        }
        if self.req.include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def new_logprobs(self, c: Choice) -> dict | None:
        start, offset = self.sent[c.index]
        lp = self.handler._logprobs(self.req, self.chat, c, start, offset)
        if lp is not None and not self.chat:
            offset += sum(len(t) for t in lp["tokens"])
        self.sent[c.index] = (len(c.logprobs), offset)
        return lp

    def piece(self, c: Choice, text: str) -> dict:
        lp = self.new_logprobs(c)
        if self.chat:
            d = {"index": c.index, "delta": {"content": text}, "logprobs": lp, "finish_reason": None}
        else:
            d = {"index": c.index, "text": text, "logprobs": lp, "finish_reason": None}
        if c.chunk_trace:
            d["routing"] = c.chunk_routing()
        return d

    def final(self, c: Choice) -> dict:
        d = {"index": c.index, "logprobs": self.new_logprobs(c), "finish_reason": c.finish_reason,
             "routing": c.routing()}  # fmt: skip
        d.update({"delta": {}} if self.chat else {"text": ""})
        return d


def _int64(seed: int) -> int:
    """A seed's 64-bit pattern as a signed int64 (what the subservers' tensors hold)."""
    seed &= _MASK64
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _usage(choices: list[Choice], n: int) -> dict:
    p = sum(c.prompt_tokens for c in choices[::n])  # a prompt counts once, however many choices it has
    g = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": p, "completion_tokens": g, "total_tokens": p + g}


async def _merge(choices: list[Choice]) -> AsyncIterator[tuple[Choice, str | None]]:
    """(choice, text) events of all choices interleaved as they come; (choice, None) when a choice finishes."""
    if len(choices) == 1:
        c = choices[0]
        async for text in c.deltas():
            yield c, text
        yield c, None
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(c: Choice) -> None:
        try:
            async for text in c.deltas():
                await queue.put((c, text))
            await queue.put((c, None))
        except Exception as e:  # an APIError: handed to the consumer
            await queue.put(e)

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    remaining = len(choices)
    try:
        while remaining:
            ev = await queue.get()
            if isinstance(ev, Exception):
                raise ev
            remaining -= ev[1] is None
            yield ev
    finally:
        for t in tasks:
            t.cancel()


async def _unless_disconnected(request: Request, aw: Awaitable) -> Any:
    """Await `aw`; if the client disconnects first, cancel it and raise. Cancelling a choice's `deltas()`
    aborts its request on every subserver."""
    task = asyncio.ensure_future(aw)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise APIError(499, "client disconnected")
    finally:
        task.cancel()


async def _run_all(choices: list[Choice]) -> None:
    """Run every choice to its end; if one fails (or this is cancelled), cancel the others (they abort)."""
    tasks = [asyncio.create_task(c.run()) for c in choices]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
