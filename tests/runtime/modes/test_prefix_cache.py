"""BlockPrefixCache: exact block-chain matching, taking over a departing request's KV, and eviction of
unreferenced leaves only, least recently used first."""

from __future__ import annotations

from tokenrouter.runtime.prefix_cache import BlockPrefixCache


def test_match_insert_and_duplicates():
    c = BlockPrefixCache(block_size=2)
    seq = [1, 2, 3, 4, 5]
    assert c.match(seq, 4) == []
    free = c.insert(seq, [10, 11, 12, 13, 14], held=[])
    assert free == [14] and c.tokens == 4  # two full blocks taken, the partial one given back
    blocks = c.match([1, 2, 3, 4, 9], 4)
    assert [b.slots for b in blocks] == [[10, 11], [12, 13]]
    assert c.match([1, 2, 9, 9], 4)[0].slots == [10, 11] and len(c.match([1, 2, 9, 9], 4)) == 1
    assert c.match([2, 1, 3, 4], 4) == []  # a block stands for its whole prefix
    assert len(c.match(seq, 3)) == 1  # never past the limit
    # a second request that computed [1, 2] again, then [7, 8]: its copy of [1, 2] is given back
    free = c.insert([1, 2, 7, 8], [20, 21, 22, 23], held=[])
    assert free == [20, 21] and c.tokens == 6
    # a request that matched both blocks and added [5, 6]: references dropped, only the new block taken
    c.ref(blocks)
    free = c.insert([1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 30, 31], held=blocks)
    assert free == [] and all(b.refs == 0 for b in blocks) and c.tokens == 8


def test_evict_unreferenced_leaves_lru_first():
    c = BlockPrefixCache(block_size=1)
    c.insert([1, 2, 3], [10, 11, 12], held=[])  # chain 1 -> 2 -> 3
    assert c.insert([1, 5], [20, 15], held=[]) == [20]  # 1 -> 5; its own copy of [1] is given back
    (b1,) = c.match([1, 9], 1)
    c.ref([b1])  # a request uses [1]
    assert c.evict(1) == [12]  # the least recently used leaf: [1, 2, 3]'s last block
    assert c.evict(2) == [11, 15]  # then [1, 2] (a leaf now), then [1, 5]
    assert c.evict(5) == []  # [1] is referenced: nothing else can go
    c.unref([b1])
    assert c.evict(5) == [10] and c.tokens == 0 and c.evicted == 4
