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
from tokenrouter.runtime.frontend.logprobs import chat_logprobs, completion_logprobs, token_text
from tokenrouter.runtime.frontend.protocol import APIError
from tokenrouter.runtime.frontend.request_manager import ReqState, RequestManager, starting_error
from tokenrouter.runtime.frontend.structured import Constraints
from tokenrouter.runtime.frontend.tools import ToolPlan, ToolStream, plan_tools, tool_message

_MASK64 = (1 << 64) - 1
_DISCONNECT_POLL_S = 0.25
_SCORES_POLL_S = 0.002  # a streamed echo waits this long between looks for the scores of its prompt


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
        self.constraints = Constraints(args.model_dir)

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
    def _prompts(
        self, req: Any, chat: bool, vocab_limit: int, tools: ToolPlan | None = None
    ) -> list[list[int]]:
        if chat:
            extra = {"tools": tools.template_tools()} if tools is not None else {}
            try:
                ids = self.codec.encode_chat(
                    req.template_messages(), **(req.chat_template_kwargs or {}), **extra
                )
            except TemplateError as e:
                raise APIError(400, str(e), param="messages") from None
            return [ids]
        return self._completion_prompts(req, vocab_limit)

    def _completion_prompts(self, req: Any, vocab_limit: int) -> list[list[int]]:
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

    def _sampling(
        self, req: Any, prompt_len: int, chat: bool, max_len: int, grammar: str = ""
    ) -> m.SamplingSpec:
        max_tokens = _max_tokens(req, prompt_len, chat, max_len)
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
            route_inputs=req.return_route_inputs,
            grammar=grammar,
            prompt_logprobs=req.prompt_logprob_count(),
        )

    # ---- serving ----------------------------------------------------------------------------------------
    async def serve(self, request: Request, req: Any, chat: bool) -> Response:
        mgr: RequestManager = request.app.state.manager
        max_len = self._servable(mgr, req)
        tools = self._tool_plan(req) if chat else None
        prompts = await self._tokenized(request, req, chat, mgr, tools)
        grammar = ""
        if tools is not None or getattr(req, "response_format", None) is not None:
            # compiling a schema (and, the first time, loading the tokenizer) can take a second: off the loop
            grammar = await run_in_threadpool(self.constraints.grammar, req, tools)
        specs = [self._sampling(req, len(ids), chat, max_len, grammar) for ids in prompts]
        echoes = self._echoes(req, prompts) if not chat and req.echo else None
        choices: list[Choice] = []
        try:
            self._submit(mgr, req, prompts, specs, choices, echoes)
            rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
            if req.stream:
                return await self._stream(request, req, chat, rid, choices, tools)
            await _unless_disconnected(request, _run_all(choices))
            return JSONResponse(self._full_body(req, chat, rid, choices, tools))
        except BaseException:  # every error path releases the requests already sent
            for c in choices:
                mgr.abort(c.state.rid)
            raise

    def _tool_plan(self, req: Any) -> ToolPlan | None:
        """A chat request's tools (tools.plan_tools); a 400 where it has tools, tool calls or tool results and
        the chat template does not render them."""
        if req.uses_tools() and not self.codec.supports_tools:
            raise APIError(400, "tools: the model's chat template does not render tools (it reads no "
                                "`tools` variable); use a model whose template supports them", param="tools")  # fmt: skip
        return plan_tools(req, self.codec.template_source)

    async def _tokenized(
        self, request: Request, req: Any, chat: bool, mgr: RequestManager, tools: ToolPlan | None
    ) -> list[list[int]]:
        # Tokenizing (and checking token ids) takes seconds for a prompt of megabytes: off the event loop, so
        # that other requests, /health included, are served meanwhile (the tokenizer releases the GIL). A short
        # body (INLINE_BODY_BYTES) is tokenized in place.
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) <= INLINE_BODY_BYTES:
            return self._prompts(req, chat, self.vocab_limit(mgr), tools)
        return await run_in_threadpool(self._prompts, req, chat, self.vocab_limit(mgr), tools)

    def _servable(self, mgr: RequestManager, req: Any) -> int:
        """The longest prompt + completion allowed, once the request names this policy and the server is up."""
        if req.model is not None and req.model != self.args.policy:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {self.args.policy!r}",
                           param="model", code="model_not_found")  # fmt: skip
        mgr.ensure_serving()
        max_len = self.max_len(mgr)
        if max_len is None:
            raise starting_error()
        entry = self.args.entry
        if req.prompt_logprob_count() >= 0 and not mgr.ready_models.get(entry, {}).get("scores_prompts"):
            raise APIError(400, f"echo with logprobs: the entry model {entry!r} does not score prompts here "
                                "(tensor parallelism and the SGLang engine do not)", param="echo")  # fmt: skip
        return max_len

    def _echoes(self, req: Any, prompts: list[list[int]]) -> list[tuple[list[int], str]]:
        """Each prompt's ids and text for `echo`: the text as given, or the ids decoded."""
        texts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        return [
            (ids, t if isinstance(t, str) else self.codec.tokenizer.decode(ids, skip_special_tokens=False))
            for ids, t in zip(prompts, texts if isinstance(texts[0], str) else prompts, strict=True)
        ]

    def _submit(
        self,
        mgr: RequestManager,
        req: Any,
        prompts: list[list[int]],
        specs: list[m.SamplingSpec],
        choices: list[Choice],
        echoes: list[tuple[list[int], str]] | None = None,
    ) -> None:
        """Submit every choice, appending each to `choices` as it is sent (so that an error aborts those sent)."""
        # n choices per prompt, choice j seeded seed + j: each equals a request of its own with that seed. Where
        # the prompt is scored (echo with logprobs), choice 0 scores it for all n: the others leave it to that
        # one (and so may start from the prefix cache) and echo its scores (`echo`'s third item).
        for i, (ids, spec) in enumerate(zip(prompts, specs, strict=True)):
            scorer = None
            for j in range(req.n):
                one = msgspec.structs.replace(spec, seed=_int64(spec.seed + j))
                if scorer is not None:
                    one = msgspec.structs.replace(one, prompt_logprobs=-1)
                st = mgr.submit(ids, one)
                scorer = scorer or st
                echo = (*echoes[i], scorer) if echoes else None
                choices.append(self._choice(mgr, req, st, i * req.n + j, echo))

    def _choice(
        self, mgr: RequestManager, req: Any, st: ReqState, index: int, echo: tuple | None = None
    ) -> Choice:
        return Choice(
            mgr,
            self.codec,
            st,
            index,
            req.stop_strings(),
            self.args.models,
            req.return_routing_trace,
            req.return_token_ids,
            req.return_routing_trace and req.stream,
            req.return_route_inputs,
            echo,
        )

    def _logprobs(self, req: Any, chat: bool, c: Choice, start: int, offset: int = 0) -> dict | None:
        """The choice's logprobs from its `start`-th token on, in the endpoint's shape; None unless asked."""
        if req.logprob_count() < 0:
            return None
        as_ids = req.return_tokens_as_token_ids
        if chat:
            return chat_logprobs(self.codec, c.logprobs[start:], as_ids)
        return completion_logprobs(self.codec, c.logprobs[start:], offset, as_ids)

    def _full_body(
        self, req: Any, chat: bool, rid: str, choices: list[Choice], tools: ToolPlan | None = None
    ) -> dict:
        out = [self._full_choice(req, chat, c, tools) for c in choices]
        return {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.args.policy,
            "choices": out,
            "usage": _usage(choices, req.n),
        }

    def _full_choice(self, req: Any, chat: bool, c: Choice, tools: ToolPlan | None) -> dict:
        d: dict = {
            "index": c.index,
            "finish_reason": c.finish_reason,
            "logprobs": self._logprobs(req, chat, c, 0),
            "routing": c.routing(),
        }
        if chat and tools is not None and tools.parses:
            d["message"], d["finish_reason"] = tool_message(c.text, c.finish_reason, tools.syntax)
        elif chat:
            d["message"] = {"role": "assistant", "content": c.text}
        elif c.echo is not None:
            d["text"] = c.echo[1] + c.text
            self._echo_logprobs(req, c, d)
        else:
            d["text"] = c.text
        return d

    def _echo_logprobs(self, req: Any, c: Choice, d: dict) -> None:
        """An echoed choice's logprobs: the prompt's (the entry model's scores, the first token's null) before
        the completion's, whose text_offset counts from the end of the prompt's text; the routing says who
        scored the prompt."""
        lp = self._prompt_logprobs(req, c)
        if lp is None:
            return
        gen = self._logprobs(req, False, c, 0, len(c.echo[1]))
        d["logprobs"] = {k: lp[k] + gen[k] for k in lp}
        d["routing"]["prompt_logprobs_from"] = self.args.entry

    def _prompt_logprobs(self, req: Any, c: Choice) -> dict | None:
        """An echoed choice's prompt logprobs in the completions shape (None unless asked), from the choice that
        scored its prompt (`_submit`)."""
        if req.logprob_count() < 0:
            return None
        ids, _, scorer = c.echo
        scored = scorer.prompt_logprobs
        if scored is None:
            raise scorer.error or APIError(
                500, f"the entry model {self.args.entry!r} sent no prompt logprobs"
            )
        entries = [(ids[0], None, None)] + [(t, e[0], e[1]) for t, e in zip(ids[1:], scored, strict=True)]
        return completion_logprobs(self.codec, entries, 0, req.return_tokens_as_token_ids)

    async def _stream(
        self,
        request: Request,
        req: Any,
        chat: bool,
        rid: str,
        choices: list[Choice],
        tools: ToolPlan | None = None,
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
        stream = _EventStream(self, req, chat, rid, choices, tools)
        return StreamingResponse(
            stream.body(first, events), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )


class _EventStream:
    """One streamed response's server-sent events: the chunks of every choice, in the endpoint's shape."""

    def __init__(
        self,
        handler: GenerationHandler,
        req: Any,
        chat: bool,
        rid: str,
        choices: list[Choice],
        tools: ToolPlan | None,
    ) -> None:
        self.handler = handler
        self.req = req
        self.chat = chat
        self.rid = rid
        self.choices = choices
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        self.created = int(time.time())
        self.policy = handler.args.policy
        self.include_usage = req.include_usage
        self.sent = {
            c.index: (0, 0) for c in choices
        }  # per choice: logprob entries sent, their text's length
        self.echoed: set[int] = set()  # the choices whose prompt (echo) was sent
        # per choice, with tools parsed: its text split into content and calls (tools.py)
        self.split = (
            {c.index: ToolStream(tools.syntax) for c in choices}
            if chat and tools is not None and tools.parses
            else {}
        )

    def chunk(self, choice_list: list[dict], usage: dict | None = None) -> str:
        body: dict = {
            "id": self.rid,
            "object": self.obj,
            "created": self.created,
            "model": self.policy,
            "choices": choice_list,
        }
        if self.include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def new_logprobs(self, c: Choice) -> dict | None:
        start, offset = self.sent[c.index]
        lp = self.handler._logprobs(self.req, self.chat, c, start, offset)
        if (
            lp is not None and not self.chat and lp["tokens"]
        ):  # the next token's offset: after the last one's text
            offset = lp["text_offset"][-1] + len(token_text(self.handler.codec, c.logprobs[-1][0]))
        self.sent[c.index] = (len(c.logprobs), offset)
        return lp

    async def echo(self, c: Choice) -> dict | None:
        """An echoed choice's first chunk: its prompt's text (and logprobs, scored by the entry model), sent
        before its first token's; the completion's text_offsets then count from the prompt text's end. Where
        another choice scores the prompt and its scores have not come yet, this waits for them."""
        if c.echo is None or c.index in self.echoed:
            return None
        self.echoed.add(c.index)
        scorer = c.echo[2]
        while self.req.logprob_count() >= 0 and scorer.prompt_logprobs is None and not scorer.done:
            await asyncio.sleep(_SCORES_POLL_S)
        text = c.echo[1]
        self.sent[c.index] = (0, len(text))
        d = {"index": c.index, "text": text, "logprobs": self.handler._prompt_logprobs(self.req, c),
             "finish_reason": None}  # fmt: skip
        if d["logprobs"] is not None:
            d["routing"] = {"prompt_logprobs_from": self.handler.args.entry}
        return d

    def piece(self, c: Choice, text: str) -> dict:
        lp = self.new_logprobs(c)
        if self.chat:
            delta = self.split[c.index].feed(text) if self.split else {"content": text}
            d = {"index": c.index, "delta": delta, "logprobs": lp, "finish_reason": None}
        else:
            d = {"index": c.index, "text": text, "logprobs": lp, "finish_reason": None}
        if c.chunk_trace:
            d["routing"] = c.chunk_routing()
        return d

    def final(self, c: Choice) -> dict:
        d = {
            "index": c.index,
            "logprobs": self.new_logprobs(c),
            "finish_reason": c.finish_reason,
            "routing": c.routing(),
        }
        d.update({"delta": {}} if self.chat else {"text": ""})
        if self.split:
            split = self.split[c.index]
            d["delta"] = split.finish()
            if split.calls and c.finish_reason == "stop":
                d["finish_reason"] = "tool_calls"
        return d

    def role_chunk(self) -> str:
        """The chat stream's first chunk: each choice's assistant role."""
        role = {"role": "assistant", "content": ""}
        return self.chunk(
            [{"index": c.index, "delta": role, "logprobs": None, "finish_reason": None} for c in self.choices]
        )

    async def body(
        self, first: tuple[Choice, str | None] | None, events: AsyncIterator[tuple[Choice, str | None]]
    ) -> AsyncIterator[str]:
        try:
            if self.chat:
                yield self.role_chunk()
            ev = first
            while ev is not None:
                c, text = ev
                if echoed := await self.echo(c):
                    yield self.chunk([echoed])
                yield self.chunk([self.final(c)] if text is None else [self.piece(c, text)])
                ev = await anext(events, None)
            if self.include_usage:
                yield self.chunk([], _usage(self.choices, self.req.n))
            yield "data: [DONE]\n\n"
        except APIError as e:
            yield f"data: {json.dumps(e.body())}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            await events.aclose()


def _max_tokens(req: Any, prompt_len: int, chat: bool, max_len: int) -> int:
    """The completion's token limit: the request's, or what the context leaves; an APIError if it does not fit."""
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
    return max_tokens


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
