"""The prefix cache of the embedded engine: every mode's subservers use it unless `--no-prefix-cache` is given.

`PrefixCachingEngine` is an `EmbeddedEngine` whose requests' KV is shared through a `BlockPrefixCache`:

- **Arrival** (`forward` with an rid the engine does not hold, or one whose KV was evicted): the sequence's
  full blocks of `block_size` tokens are matched against the cache (at most `len - 1` tokens, so that at least
  one token runs and gives logits). The matched blocks' KV slots are written into the request's row of
  `req_to_token` and referenced (never copied); only the rest of the tokens is computed, as an extend on top
  of that prefix (the same step as any extend: CUDA graphs hold it when its new tokens fit a captured shape).
  In TokenRouter mode this covers new requests on the entry model and a request's first arrival on any other
  model (its first hop carries the whole sequence); a return from a hop finds its KV held and extends only
  the new tokens, as without the cache.
- **While it runs or is held**: each full block of its KV that the cache does not hold yet is *published* after
  the step that completed it: the cache owns those slots from then on, the request references them, and
  other requests arriving meanwhile match them (a request pending on another model shares its prompt).
- **Departure** (`release`): the request's references are dropped and the rest of its full blocks go into the
  cache; blocks the cache already had (computed twice) and the partial last block are freed.
- **Memory pressure**: unreferenced cache blocks are evicted first (least recently used leaves first), then
  held requests as the embedded engine always does (an evicted request's published blocks stay cached, so
  its next step matches them). A block some request references is never evicted, and never written: a step
  writes only the slots it allocates.

Blocks are keyed by (parent block, the block's tokens), so a block stands for its whole prefix and a match
is exact (no hash collisions). A partial last block is never cached: at most `block_size - 1` tokens of a
matched sequence are computed again (docs/serving.md, "Prefix cache"). Counters in `stats()`:
`prefix_matched_tokens` (tokens whose KV came from the cache on arrival), `prefix_computed_tokens` (tokens
computed on arrival), `prefix_arrivals`, `prefix_cached_blocks` / `prefix_cached_tokens` (held by the cache
now), `prefix_evicted_blocks`, `prefix_waited_rows` (arrivals that waited a step for another arrival's prefill
of the same prefix: `late_shared_prefills`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenrouter.runtime.engine.base import StepInput, StepOutput
from tokenrouter.runtime.engine.embedded import EmbeddedEngine, Req

DEFAULT_BLOCK_SIZE = 16  # tokens per cache block (vLLM's default block size)
SHARED_PREFILL_BLOCKS = (
    2  # arrivals of a step whose uncached tokens start with the same blocks prefill them once
)


@dataclass(slots=True, eq=False)
class Block:
    id: int
    parent: Block | None
    tokens: tuple[int, ...]
    slots: list[int]  # KV slot ids of these tokens, owned by the cache
    refs: int = 0  # requests using this block now
    children: int = 0  # cached blocks that extend this one


class BlockPrefixCache:
    """Cached KV blocks as a tree: a block is reachable only through its parent (its prefix). A request that
    references a block references its whole chain, so an unreferenced block has only unreferenced children
    and every unreferenced block can be evicted, leaves first (`free_tokens`)."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.blocks: dict[tuple[int, tuple[int, ...]], Block] = {}
        self.lru: OrderedDict[int, Block] = OrderedDict()  # least recently used first
        self._next_id = 1
        self.evicted = 0
        self.unreferenced = 0  # blocks no request references (evictable)

    @property
    def tokens(self) -> int:
        return len(self.blocks) * self.block_size

    @property
    def free_tokens(self) -> int:
        """Slots that eviction can give back: those of every unreferenced block."""
        return self.unreferenced * self.block_size

    def ref(self, blocks: Sequence[Block]) -> None:
        for block in blocks:
            if block.refs == 0:
                self.unreferenced -= 1
            block.refs += 1

    def unref(self, blocks: Sequence[Block]) -> None:
        for block in blocks:
            block.refs -= 1
            if block.refs == 0:
                self.unreferenced += 1

    def match(self, tokens: Sequence[int], limit: int) -> list[Block]:
        """The longest chain of cached blocks that is a prefix of tokens[:limit] (marked as used now)."""
        out = self.peek(tokens, limit)
        for block in out:  # root to leaf, so a parent is never less recently used than its children
            self.lru.move_to_end(block.id)
        return out

    def peek(self, tokens: Sequence[int], limit: int) -> list[Block]:
        """The longest chain of cached blocks that is a prefix of tokens[:limit], leaving the LRU order as it is."""
        bs, out, parent = self.block_size, [], 0
        for i in range(limit // bs):
            block = self.blocks.get((parent, tuple(tokens[i * bs : (i + 1) * bs])))
            if block is None:
                break
            out.append(block)
            parent = block.id
        return out

    def publish(self, tokens: Sequence[int], slots: list[int], held: list[Block]) -> bool:
        """A running request's full blocks after its first len(held) (the cache's already, referenced by it):
        each becomes a cache block referenced by the request and appended to `held`, until one the cache
        already has in another copy. Returns False when it stopped there (the request keeps its own copy, and
        the cache's later blocks cannot continue it), True when every full block is held."""
        bs = self.block_size
        parent = held[-1] if held else None
        for i in range(len(held), len(tokens) // bs):
            key = (parent.id if parent else 0, tuple(tokens[i * bs : (i + 1) * bs]))
            if key in self.blocks:
                return False
            parent = self._add(key, parent, slots[i * bs : (i + 1) * bs], refs=1)
            held.append(parent)
        return True

    def insert(self, tokens: Sequence[int], slots: list[int], held: list[Block]) -> list[int]:
        """Take over a departing request's KV: tokens[i] is in slots[i]; its first len(held) blocks are the
        cache's own (their references are dropped here). Returns the slots the cache did not take (to free)."""
        bs = self.block_size
        self.unref(held)
        parent = held[-1] if held else None
        free: list[int] = []
        for i in range(len(held), len(tokens) // bs):
            own = slots[i * bs : (i + 1) * bs]
            key = (parent.id if parent else 0, tuple(tokens[i * bs : (i + 1) * bs]))
            block = self.blocks.get(key)
            if block is None:
                block = self._add(key, parent, own, refs=0)
            else:
                free.extend(own)  # computed twice: keep the cache's copy
                self.lru.move_to_end(block.id)
            parent = block
        free.extend(slots[(len(tokens) // bs) * bs :])
        return free

    def evict(self, want: int) -> list[int]:
        """Drop unreferenced leaf blocks, least recently used first, until `want` slots are freed (or none
        is left to drop). Returns the freed slots. Each pass walks the LRU order only as far as it needs (a
        server that has run a while holds a full pool of blocks, and evicts a few every step)."""
        freed: list[int] = []
        while len(freed) < want:
            victims, n = [], len(freed)
            for block in self.lru.values():
                if block.refs == 0 and block.children == 0:
                    victims.append(block)
                    n += len(block.slots)
                    if n >= want:
                        break
            if not victims:
                break
            for block in victims:  # a parent left childless here is a leaf in the next pass
                self._remove(block)
                freed.extend(block.slots)
        return freed

    def _add(
        self, key: tuple[int, tuple[int, ...]], parent: Block | None, slots: list[int], refs: int
    ) -> Block:
        block = Block(self._next_id, parent, key[1], slots, refs=refs)
        self._next_id += 1
        self.blocks[key] = block
        self.lru[block.id] = block
        if parent is not None:
            parent.children += 1
        if refs == 0:
            self.unreferenced += 1
        return block

    def _remove(self, block: Block) -> None:
        del self.blocks[(block.parent.id if block.parent else 0, block.tokens)]
        del self.lru[block.id]
        if block.parent is not None:
            block.parent.children -= 1
        self.unreferenced -= 1
        self.evicted += 1


class PrefixCachingEngine(EmbeddedEngine):
    """An EmbeddedEngine whose requests start from the longest cached prefix and leave their KV in the cache."""

    block_size = DEFAULT_BLOCK_SIZE

    def __init__(self, *args, **kwargs) -> None:
        # before the engine's own construction: its start-up runs steps that free KV through `_free_kv`
        self.cache = BlockPrefixCache(self.block_size)
        self.held_blocks: dict[str, list[Block]] = {}  # rid -> cache blocks its KV starts with (referenced)
        self.unshared: set[str] = set()  # rids whose next full block the cache holds in another copy
        self.matched_tokens = 0
        self.computed_tokens = 0
        self.arrivals = 0
        self.waited_rows = 0  # arrivals that waited a step for another's prefill of their prefix
        super().__init__(*args, **kwargs)

    def forward(self, batch: Sequence[StepInput], want_hidden: bool = False) -> StepOutput:
        rows = list(batch)
        if not rows:
            raise ValueError("forward needs at least one row")
        self._validate(rows)  # a refused step changes nothing, as the Engine contract says
        keep = {r.rid for r in rows}
        reqs = self.reqs
        rows = [
            r if (q := reqs.get(r.rid)) is not None and q.req_pool_idx else self._arrive(r, keep)
            for r in rows
        ]
        out = super().forward(rows, want_hidden)
        self._publish(rows)
        return out

    def _arrive(self, row: StepInput, keep: set[str]) -> StepInput:
        """A request without KV here (new, or evicted while held): attach the longest cached prefix of its whole
        sequence; the returned row carries only the rest."""
        old = self.reqs.get(row.rid)
        history = old.token_ids if old is not None else []
        tokens = history + [int(t) for t in row.new_token_ids]
        self.arrivals += 1
        # a scored row computes every position (scoring.py): no cached prefix
        blocks = self.cache.match(tokens, len(tokens) - 1) if row.prompt_logprobs < 0 else []
        self.cache.ref(blocks)  # before making room: nothing may evict them now
        if blocks and self.req_to_token_pool.available_size() == 0 and not self._make_room(0, 1, keep):
            # no request row to attach to now; the engine finds one for a full prefill
            self.cache.unref(blocks)
            blocks = []
        n = len(blocks) * self.cache.block_size
        self.matched_tokens += n
        self.computed_tokens += len(tokens) - n
        if not n:
            return row
        if old is not None:
            self.reprefills += 1  # the rest of its history is computed again
        self._attach(row.rid, tokens[:n], blocks)
        return StepInput(row.rid, tokens[n:])

    def late_shared_prefills(self, arrivals: Sequence[tuple[str, Sequence[int]]]) -> set[str]:
        """Arrivals whose uncached tokens start with the same `SHARED_PREFILL_BLOCKS` full blocks, after the same
        cached prefix, as an earlier arrival of the step: the earlier one computes them and publishes its blocks
        after the step, and the others match those blocks in the next step instead of computing them again (a
        wave of requests with a new system prompt, or their first hops to this model, prefill it once)."""
        bs, span, seen, late = (
            self.cache.block_size,
            SHARED_PREFILL_BLOCKS * self.cache.block_size,
            set(),
            set(),
        )
        for rid, tokens in arrivals:
            blocks = self.cache.peek(tokens, len(tokens) - 1)
            n = len(blocks) * bs
            if len(tokens) - 1 - n < span:
                continue
            key = (blocks[-1].id if blocks else 0, tuple(tokens[n : n + span]))
            if key in seen:
                late.add(rid)
            seen.add(key)
        self.waited_rows += len(late)
        return late

    def _attach(self, rid: str, prefix: list[int], blocks: list) -> None:
        """Give request `rid` a request row holding the cached `blocks` of its `prefix`."""
        n = len(prefix)
        slots = [s for block in blocks for s in block.slots]
        idx = self.req_to_token_pool.alloc()
        self.req_to_token_pool.write(idx, 0, torch.tensor(slots, dtype=torch.int64, device=self.device))
        self.reqs[rid] = Req(rid, prefix, kv_len=n, req_pool_idx=idx, slots=slots)
        self.lru[rid] = None
        self.held_blocks[rid] = blocks
        self.unshared.discard(rid)

    def _publish(self, rows: list[StepInput]) -> None:
        """Hand the cache each full block the step completed (see `BlockPrefixCache.publish`)."""
        bs, held_blocks, unshared = self.cache.block_size, self.held_blocks, self.unshared
        for row in rows:
            rid = row.rid
            req = self.reqs.get(rid)
            if req is None or not req.req_pool_idx or rid in unshared:
                continue
            held = held_blocks.get(rid)
            if held is None:
                held = held_blocks[rid] = []
            if req.kv_len // bs > len(held) and not self.cache.publish(req.token_ids, req.slots, held):
                unshared.add(rid)

    def release(self, rid: str) -> None:
        req = self.reqs.pop(rid, None)
        self.unshared.discard(rid)
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
        self.unshared.discard(req.rid)
        self.cache.unref(held)
        req.slots = req.slots[len(held) * self.cache.block_size :]
        super()._free_kv(req)

    def kv_room(self) -> tuple[int, int]:
        """Free slots counting the unreferenced cache blocks `_make_room` evicts first (an arriving row's need, as
        the scheduler counts it, leaves out the prefix it will match: an upper bound)."""
        return (
            self.token_to_kv_pool.available_size() + self.cache.free_tokens,
            self.req_to_token_pool.available_size(),
        )

    def _make_room(self, need_tokens: int, need_rows: int, keep: set[str]) -> bool:
        """Evict unreferenced cache blocks first, then held requests least recently used first (never those in
        `keep`), until the step fits; an evicted request's published blocks are cache blocks from then on."""
        pool, rows = self.token_to_kv_pool, self.req_to_token_pool
        while True:
            short = need_tokens - pool.available_size()
            if short > 0 and (freed := self.cache.evict(short)):
                pool.free(torch.tensor(freed, dtype=torch.int64))
                short = need_tokens - pool.available_size()
            if short <= 0 and rows.available_size() >= need_rows:
                return True
            victim = next((rid for rid in self.lru if rid not in keep), None)
            if victim is None:
                return False
            self._free_kv(self.reqs[victim])
            self.evictions += 1

    def stats(self) -> dict:
        return {
            **super().stats(),
            "prefix_cache": True,
            "prefix_block_size": self.cache.block_size,
            "prefix_arrivals": self.arrivals,
            "prefix_matched_tokens": self.matched_tokens,
            "prefix_computed_tokens": self.computed_tokens,
            "prefix_cached_blocks": len(self.cache.blocks),
            "prefix_cached_tokens": self.cache.tokens,
            "prefix_evicted_blocks": self.cache.evicted,
            "prefix_waited_rows": self.waited_rows,
        }
