"""One choice of one HTTP request: consume its tokens, detokenize incrementally, apply stop strings.

Stop strings are matched on the detokenized text; on a match the text is cut before the stop string, the
request is aborted on every subserver, and the choice finishes with `finish_reason="stop"`. While streaming,
the last `len(longest stop) - 1` characters are held back, since they may be the start of a stop string.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tokenrouter.runtime.frontend.codec import Detokenizer, TextCodec
from tokenrouter.runtime.frontend.protocol import APIError
from tokenrouter.runtime.frontend.request_manager import ReqState, RequestManager
from tokenrouter.runtime.frontend.route_inputs import merge_late

GAP_TIMEOUT_S = 10.0  # after Finished, how long a missing earlier token may take to arrive


@dataclass(slots=True)
class Choice:
    manager: RequestManager
    codec: TextCodec
    state: ReqState
    index: int
    stop: list[str]
    models: list[str]
    want_trace: bool = False
    want_ids: bool = False
    chunk_trace: bool = False  # streamed with want_trace: each text increment carries its tokens' routing
    want_inputs: bool = False  # return_route_inputs: each token's route decisions (route_inputs.py)
    echo: tuple[list[int], str] | None = None  # the request's echo: the prompt's token ids and its text
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    per_model: Counter = field(default_factory=Counter)
    trace: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    # with chunk_trace: per text increment that deltas() yielded, in order, (the models, the text) of each token
    # it took; the streaming response pops one per increment (`chunk_routing`)
    chunks: deque = field(default_factory=deque)
    # per token with logprobs asked for: (token id, its log-probability, [(id, log-probability)] most likely)
    logprobs: list[tuple[int, float, list]] = field(default_factory=list)
    inputs: list[list[dict]] = field(default_factory=list)  # with want_inputs: per token, its decisions
    _emitted: int = 0

    @property
    def prompt_tokens(self) -> int:
        return self.state.prompt_len

    def routing(self) -> dict:
        out: dict = {
            "tokens_per_model": {x: self.per_model.get(x, 0) for x in self.models},
            "hops": len(self.state.hops),
        }
        if self.want_trace:
            out["trace"] = list(self.trace)
        if self.want_ids:
            out["token_ids"] = list(self.token_ids)
        if self.want_inputs:
            merge_late(self.inputs, self.state.decisions)
            out["inputs"] = list(self.inputs)
        return out

    def chunk_routing(self) -> dict:
        """The `routing` of the next streamed text increment: the model and the text of each of its tokens
        (without stop strings the increment's text is exactly the pieces joined)."""
        models, pieces, inputs = self.chunks.popleft()
        out = {"trace": models, "pieces": pieces}
        if self.want_inputs:
            out["inputs"] = inputs
        return out

    async def deltas(self) -> AsyncIterator[str]:
        """Text increments until the choice is finished; raises the request's APIError on failure. If the
        consumer stops early (client gone, task cancelled), the request is aborted everywhere."""
        detok = self.codec.decoder()
        hold = max((len(s) for s in self.stop), default=1) - 1
        st = self.state
        try:
            while True:
                await self._next_tokens(st)
                before = self.completion_tokens
                models, pieces, inputs = self._take(st, detok, hold)
                end = self._text_end(st, detok, pieces, hold)
                if end > self._emitted or self.completion_tokens > before:
                    # a chunk per batch of new tokens, even when they add no text yet (held back by the
                    # detokenizer or a possible stop string), so streaming clients see every step
                    piece, self._emitted = self.text[self._emitted : end], max(end, self._emitted)
                    if self.chunk_trace:
                        self.chunks.append((models, pieces, inputs))
                    yield piece
                if self.finish_reason is not None:
                    return
        finally:
            if self.finish_reason is None:
                self.manager.abort(st.rid, reason="abort")

    def _text_end(self, st: ReqState, detok: Detokenizer, pieces: list[str], hold: int) -> int:
        """Where the text that may be sent now ends (finishing the choice if the request is done)."""
        if self.finish_reason is None and st.done:
            # text still held by the detokenizer (an incomplete UTF-8 sequence at the very end)
            rest = detok.flush()
            if pieces:
                pieces[-1] += rest
            if not self._append(rest, hold):
                self.finish_reason = st.finish_reason or "stop"
        if self.finish_reason is not None:
            return len(self.text)
        return max(self._emitted, len(self.text) - hold)

    async def _next_tokens(self, st: ReqState) -> None:
        """Wait until the request has news (tokens, its end, an error); raise its error if it failed."""
        if st.finish_reason is None:
            await st.event.wait()
        else:  # finished, but a token sent by another subserver is still on its way
            try:
                await asyncio.wait_for(st.event.wait(), GAP_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise APIError(500, f"the request finished with token {st.next_index} missing") from None
        st.event.clear()
        if st.error is not None:
            raise st.error

    def _take(self, st: ReqState, detok: Detokenizer, hold: int) -> tuple[list, list, list]:
        """Take the request's new tokens into the choice (until a stop string); the chunk trace's models, text
        pieces and route inputs of those tokens."""
        models, pieces, inputs = [], [], []
        for tok, model in st.take():
            lp = st.logprobs.pop(self.completion_tokens, None)
            if lp is not None:
                self.logprobs.append((tok, lp[0], lp[1]))
            if self.want_inputs:
                self.inputs.append(st.decisions.pop(self.completion_tokens, []))
                inputs.append(self.inputs[-1])
            self.completion_tokens += 1
            self.per_model[model] += 1
            text = detok.step(tok)
            if self.want_trace:
                self.trace.append(model)
            if self.chunk_trace:
                models.append(model)
                pieces.append(text)
            if self.want_ids:
                self.token_ids.append(tok)
            if self._append(text, hold):
                break
        return models, pieces, inputs

    def _append(self, piece: str, hold: int) -> bool:
        """Add text; on a stop string, cut before it, abort the request everywhere and return True."""
        if not piece:
            return False
        start = max(0, len(self.text) - hold)
        self.text += piece
        cut = self._find_stop(start)
        if cut is None:
            return False
        self.text = self.text[:cut]
        self.finish_reason = "stop"
        self.manager.abort(self.state.rid, reason="stop")
        return True

    async def run(self) -> Choice:
        async for _ in self.deltas():
            pass
        return self

    def _find_stop(self, start: int) -> int | None:
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None
