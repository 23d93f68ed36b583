"""The request bookkeeping every engine with a token-slot KV pool shares (embedded, SGLang).

An engine built on `HeldRequestsEngine` keeps, per request, its whole token history and — while resident — its
KV slots and a request-table row. This class implements the parts of the `Engine` contract that do not depend
on how the model runs: validating a step (a refused step changes nothing), splitting it into `max_batch` pieces
and into halves when the pool is short, least-recently-used eviction of held requests (their history stays, so
the next step re-prefills them transparently), `release`, `seq_len` and the common `stats()` fields.

A subclass sets `model_config`, `max_len`, `max_batch` and `req_to_token_pool` (anything with `size` and
`available_size()`), calls `_init_requests()`, and implements the hooks below.
"""

from __future__ import annotations

import numbers
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Sequence

import torch

from tokenrouter.runtime.engine.base import Engine, EngineError, StepInput, StepOutput


class EngineRowError(EngineError):
    """One row of a step can never run (the message says why); `rid` names it."""

    def __init__(self, rid: str, message: str) -> None:
        super().__init__(f"request {rid!r}: {message}")
        self.rid = rid


class HeldRequestsEngine(Engine):
    # --- hooks --------------------------------------------------------------------------------------------
    @abstractmethod
    def _new_req(self, rid: str):
        """A request record not seen before (not resident)."""

    @abstractmethod
    def _resident(self, req) -> bool:
        """Whether the request's KV is in the pool."""

    @abstractmethod
    def _kv_available(self) -> int:
        """Free KV token slots."""

    @abstractmethod
    def _pages_total(self) -> int:
        """All KV token slots."""

    @abstractmethod
    def _free_kv(self, req) -> None:
        """Give the request's slots and row back; it stays known (its history is kept)."""

    @abstractmethod
    def _forward_fitting(
        self, rows: list[StepInput], reqs: list, need_tokens: int, want_hidden: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """Run rows that fit in the pool now: (logits, hidden, tokens computed)."""

    def _counters(self) -> dict[str, int]:
        """Counters whose change over one step goes into that step's stats."""
        return {"evicted": self.evictions, "reprefilled": self.reprefills}

    def _extra_stats(self) -> dict:
        return {}

    # --- shared ---------------------------------------------------------------------------------------------
    def _init_requests(self) -> None:
        self.reqs: dict = {}
        self.lru: OrderedDict[str, None] = OrderedDict()  # resident rids, least recently used first
        self.evictions = 0
        self.reprefills = 0
        self.steps = 0

    def forward(self, batch: Sequence[StepInput], want_hidden: bool = False) -> StepOutput:
        rows = list(batch)
        if not rows:
            raise ValueError("forward needs at least one row")
        self._validate(rows)
        before = self._counters()
        self.scored: dict[str, list] = {}  # the step's scored rows (`_forward_fitting` fills it)
        outs = self._forward_chunks(rows, want_hidden)
        self.steps += 1
        logits = outs[0][0] if len(outs) == 1 else torch.cat([o[0] for o in outs])
        hidden = None
        if want_hidden:
            hidden = outs[0][1] if len(outs) == 1 else torch.cat([o[1] for o in outs])
        stats = self._step_stats(rows, outs, before)
        return StepOutput(logits=logits, hidden=hidden, stats=stats, prompt_logprobs=self.scored)

    def _forward_chunks(self, rows: list[StepInput], want_hidden: bool) -> list:
        """`_forward_rows`' outputs for the rows, in forwards of at most `max_batch` rows."""
        if len(rows) <= self.max_batch:
            return self._forward_rows(rows, want_hidden)
        return [
            o
            for i in range(0, len(rows), self.max_batch)
            for o in self._forward_rows(rows[i : i + self.max_batch], want_hidden)
        ]

    def _step_stats(self, rows: list[StepInput], outs: list, before: dict[str, int]) -> dict:
        """One step's stats: its kind, rows, tokens and forwards, and the counters' change since `before`."""
        new_tokens = [len(r.new_token_ids) for r in rows]
        longest = max(new_tokens)  # the longest row's new tokens (an evicted row's re-prefill not included)
        return {
            "mode": "decode" if longest == 1 else ("extend" if min(new_tokens) > 1 else "mixed"),
            "rows": len(rows),
            "tokens": sum(o[2] for o in outs),
            "longest": longest,
            "forwards": len(outs),
            **{name: value - before[name] for name, value in self._counters().items()},
        }

    def release(self, rid: str) -> None:
        req = self.reqs.pop(rid, None)
        if req is not None and self._resident(req):
            self._free_kv(req)

    def kv_room(self) -> tuple[int, int]:
        return self._kv_available(), self.req_to_token_pool.available_size()

    def resident(self, rid: str) -> bool:
        req = self.reqs.get(rid)
        return req is not None and self._resident(req)

    def seq_len(self, rid: str) -> int:
        req = self.reqs.get(rid)
        return 0 if req is None else len(req.token_ids)

    def stats(self) -> dict:
        total, free, r2t = self._pages_total(), self._kv_available(), self.req_to_token_pool
        resident = sum(1 for r in self.reqs.values() if self._resident(r))
        return {
            "pages_total": total,
            "pages_free": free,
            "pages_used": total - free,
            "page_size": 1,
            "req_slots_total": r2t.size,
            "req_slots_free": r2t.available_size(),
            "requests": len(self.reqs),
            "held": resident,
            "evicted_held": len(self.reqs) - resident,
            "evictions": self.evictions,
            "reprefills": self.reprefills,
            "steps": self.steps,
            "max_len": self.max_len,
            **self._extra_stats(),
        }

    def _validate(self, rows: list[StepInput]) -> None:
        seen: set[str] = set()
        vocab = self.model_config.vocab_size
        for row in rows:
            if row.rid in seen:
                raise EngineRowError(row.rid, "appears twice in one step")
            seen.add(row.rid)
            new = row.new_token_ids
            if len(new) == 0:
                raise EngineRowError(row.rid, "a step needs at least one new token")
            if not all(type(t) is int for t in new) and any(
                isinstance(t, bool) or not isinstance(t, numbers.Integral) for t in new
            ):
                raise EngineRowError(row.rid, "token ids must be ints")
            if min(new) < 0 or max(new) >= vocab:
                raise EngineRowError(row.rid, f"token id out of range 0..{vocab - 1}")
            if row.prompt_logprobs >= 0 and (not self.info.scores_prompts or self.seq_len(row.rid)):
                what = "its first step" if self.info.scores_prompts else "an engine that scores prompts"
                raise EngineRowError(row.rid, f"prompt logprobs need {what}")
            total = self.seq_len(row.rid) + len(new)
            if total > self.max_len:
                raise EngineRowError(row.rid, f"{total} tokens exceed the engine's max_len {self.max_len}")

    def _forward_rows(
        self, rows: list[StepInput], want_hidden: bool
    ) -> list[tuple[torch.Tensor, torch.Tensor | None, int]]:
        """Run rows (≤ max_batch) in one forward if they fit, else in halves. Returns one
        (logits, hidden, tokens) per model forward."""
        known = self.reqs
        reqs = [known.get(r.rid) or self._new_req(r.rid) for r in rows]
        need_tokens = need_rows = 0
        for r, q in zip(rows, reqs, strict=True):
            need_tokens += len(r.new_token_ids)
            if not self._resident(q):
                need_tokens += len(q.token_ids)
                need_rows += 1
        fits = self._kv_available() >= need_tokens and self.req_to_token_pool.available_size() >= need_rows
        if not fits and not self._make_room(need_tokens, need_rows, {r.rid for r in rows}):
            if len(rows) == 1:  # cannot happen while max_len <= pool size; kept as a clear error
                raise EngineRowError(rows[0].rid, "does not fit in the KV pool even alone")
            half = len(rows) // 2
            return self._forward_rows(rows[:half], want_hidden) + self._forward_rows(rows[half:], want_hidden)
        return [self._forward_fitting(rows, reqs, need_tokens, want_hidden)]

    def _make_room(self, need_tokens: int, need_rows: int, keep: set[str]) -> bool:
        """Evict held requests, least recently used first (never those in `keep`), until the step fits."""
        while self._kv_available() < need_tokens or self.req_to_token_pool.available_size() < need_rows:
            victim = next((rid for rid in self.lru if rid not in keep), None)
            if victim is None:
                return False
            self._free_kv(self.reqs[victim])
            self.evictions += 1
        return True
