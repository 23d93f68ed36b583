"""Prefix caching in the embedded engine, for the `std-serving` baseline (a plain prefix-caching server).

`PrefixCachingEngine` is an `EmbeddedEngine` whose departed requests leave their KV behind in a
`BlockPrefixCache`, and whose new requests start from the longest cached prefix of their tokens:

- **Arrival** (`forward` with an rid the engine does not hold): the prompt's full blocks of `block_size`
  tokens are matched against the cache (at most `len - 1` tokens, so that at least one token runs and gives
  logits). The matched blocks' KV slots are written into the request's row of `req_to_token` and
  referenced (never copied); only the rest of the tokens is prefilled, as an extend on top of that prefix.
- **Departure** (`release`): the request's KV is *released into the cache*, not freed: each full block of
  its KV that the cache does not already hold becomes a cache block (the cache takes over those slots);
  blocks the cache already had (matched on arrival, or computed twice) are dropped from the request, and
  the partial last block is freed.
- **Memory pressure**: unreferenced cache blocks are evicted first (least recently used leaves first), then
  held requests as the embedded engine always does.

Blocks are keyed by (parent block, the block's tokens), so a block stands for its whole prefix and a match
is exact (no hash collisions). Counters in `stats()`: `prefix_matched_tokens` (tokens whose KV came from
the cache on arrival) and `prefix_computed_tokens` (tokens prefilled on arrival), `prefix_arrivals`,
`prefix_cached_tokens` (tokens held by the cache now), `prefix_evicted_blocks`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenrouter.runtime.engine.base import StepInput, StepOutput
from tokenrouter.runtime.engine.embedded import EmbeddedEngine, Req

DEFAULT_BLOCK_SIZE = 16  # tokens per cache block (vLLM's default block size)


@dataclass(slots=True, eq=False)
class Block:
    id: int
    parent: Block | None
    tokens: tuple[int, ...]
    slots: list[int]  # KV slot ids of these tokens, owned by the cache
    refs: int = 0  # requests using this block now
    children: int = 0  # cached blocks that extend this one


class BlockPrefixCache:
    """Cached KV blocks as a tree: a block is reachable only through its parent (its prefix)."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.blocks: dict[tuple[int, tuple[int, ...]], Block] = {}
        self.lru: OrderedDict[int, Block] = OrderedDict()  # least recently used first
        self._next_id = 1
        self.evicted = 0

    @property
    def tokens(self) -> int:
        return len(self.blocks) * self.block_size

    def match(self, tokens: Sequence[int], limit: int) -> list[Block]:
        """The longest chain of cached blocks that is a prefix of tokens[:limit] (marked as used now)."""
        bs, out, parent = self.block_size, [], 0
        for i in range(limit // bs):
            block = self.blocks.get((parent, tuple(tokens[i * bs : (i + 1) * bs])))
            if block is None:
                break
            out.append(block)
            parent = block.id
        for block in out:  # root to leaf, so a parent is never less recently used than its children
            self.lru.move_to_end(block.id)
        return out

    def insert(self, tokens: Sequence[int], slots: list[int], held: list[Block]) -> list[int]:
        """Take over a departing request's KV: tokens[i] is in slots[i]; its first len(held) blocks are the
        cache's own (their references are dropped here). Returns the slots the cache did not take (to free)."""
        bs = self.block_size
        for block in held:
            block.refs -= 1
        parent = held[-1] if held else None
        free: list[int] = []
        for i in range(len(held), len(tokens) // bs):
            chunk, own = tuple(tokens[i * bs : (i + 1) * bs]), slots[i * bs : (i + 1) * bs]
            key = (parent.id if parent else 0, chunk)
            block = self.blocks.get(key)
            if block is None:
                block = Block(self._next_id, parent, chunk, own)
                self._next_id += 1
                self.blocks[key] = block
                if parent is not None:
                    parent.children += 1
            else:
                free.extend(own)  # computed twice: keep the cache's copy
            self.lru[block.id] = block
            self.lru.move_to_end(block.id)
            parent = block
        free.extend(slots[(len(tokens) // bs) * bs :])
        return free

    def evict(self, want: int) -> list[int]:
        """Drop unreferenced leaf blocks, least recently used first, until `want` slots are freed (or none
        is left to drop). Returns the freed slots."""
        freed: list[int] = []
        progress = True
        while len(freed) < want and progress:
            progress = False
            for block in list(self.lru.values()):
                if block.refs == 0 and block.children == 0:
                    self._remove(block)
                    freed.extend(block.slots)
                    progress = True
                    if len(freed) >= want:
                        break
        return freed

    def _remove(self, block: Block) -> None:
        del self.blocks[(block.parent.id if block.parent else 0, block.tokens)]
        del self.lru[block.id]
        if block.parent is not None:
            block.parent.children -= 1
        self.evicted += 1


class PrefixCachingEngine(EmbeddedEngine):
    """An EmbeddedEngine that releases requests into a prefix cache and starts new ones from it."""

    block_size = DEFAULT_BLOCK_SIZE

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cache = BlockPrefixCache(self.block_size)
        self.held_blocks: dict[str, list[Block]] = {}  # rid -> cache blocks its KV starts with
        self.matched_tokens = 0
        self.computed_tokens = 0
        self.arrivals = 0

    def forward(self, batch: Sequence[StepInput], want_hidden: bool = False) -> StepOutput:
        rows = list(batch)
        if not rows:
            raise ValueError("forward needs at least one row")
        self._validate(rows)  # a refused step changes nothing, as the Engine contract says
        keep = {r.rid for r in rows}
        rows = [r if r.rid in self.reqs else self._arrive(r, keep) for r in rows]
        return super().forward(rows, want_hidden)

    def _arrive(self, row: StepInput, keep: set[str]) -> StepInput:
        """A new request: attach the longest cached prefix; the returned row carries only the rest."""
        tokens = [int(t) for t in row.new_token_ids]
        self.arrivals += 1
        blocks = self.cache.match(tokens, len(tokens) - 1)
        n = len(blocks) * self.cache.block_size
        if n and self.req_to_token_pool.available_size() == 0 and not self._make_room(0, 1, keep):
            n, blocks = 0, []  # no request row to attach to now; the engine finds one for a full prefill
        self.matched_tokens += n
        self.computed_tokens += len(tokens) - n
        if not n:
            return row
        for block in blocks:
            block.refs += 1
        slots = [s for block in blocks for s in block.slots]
        idx = self.req_to_token_pool.alloc()
        self.req_to_token_pool.write(idx, 0, torch.tensor(slots, dtype=torch.int64, device=self.device))
        self.reqs[row.rid] = Req(row.rid, tokens[:n], kv_len=n, req_pool_idx=idx, slots=slots)
        self.lru[row.rid] = None
        self.held_blocks[row.rid] = blocks
        return StepInput(row.rid, tokens[n:])

    def release(self, rid: str) -> None:
        req = self.reqs.pop(rid, None)
        if req is None:
            return
        held = self.held_blocks.pop(rid, [])
        if not req.req_pool_idx:  # evicted earlier: its blocks were given back then
            return
        req.slots = self.cache.insert(req.token_ids[: req.kv_len], req.slots, held)
        EmbeddedEngine._free_kv(self, req)  # frees the slots the cache did not take, and the row

    def _free_kv(self, req: Req) -> None:
        """Eviction of a held request (or release of a failed one): shared blocks are unreferenced, only
        the request's own slots are freed."""
        held = self.held_blocks.pop(req.rid, [])
        for block in held:
            block.refs -= 1
        req.slots = req.slots[len(held) * self.cache.block_size :]
        super()._free_kv(req)

    def kv_room(self) -> None:
        """Not said: the pool's free slots leave out the cached blocks `_make_room` evicts first, which in a
        server that has run a while fill the pool, and an arriving row's need leaves out its matched prefix; so
        the scheduler leaves each step's rows to this engine, as a plain prefix-caching server does."""
        return None

    def _make_room(self, need_tokens: int, need_rows: int, keep: set[str]) -> bool:
        short = need_tokens - self.token_to_kv_pool.available_size()
        if short > 0:
            freed = self.cache.evict(short)
            if freed:
                self.token_to_kv_pool.free(torch.tensor(freed, dtype=torch.int64))
        return super()._make_room(need_tokens, need_rows, keep)

    def stats(self) -> dict:
        return {
            **super().stats(),
            "prefix_block_size": self.cache.block_size,
            "prefix_arrivals": self.arrivals,
            "prefix_matched_tokens": self.matched_tokens,
            "prefix_computed_tokens": self.computed_tokens,
            "prefix_cached_tokens": self.cache.tokens,
            "prefix_evicted_blocks": self.cache.evicted,
        }
