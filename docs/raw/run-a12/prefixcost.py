"""Host-side cost of what std-serving does per arrival and departure, on this machine's CPU (no GPU):
matching a sequence against the prefix cache, inserting it at release, and a msgpack round trip of its
tokens (the hop message carries the whole sequence). Thirty-ninth session; output in prefixcost.txt."""

import random
import time

import msgspec

from tokenrouter.runtime.prefix_cache import BlockPrefixCache

REPS = 200
for n in (544, 1536, 3584):
    toks = [random.randrange(150000) for _ in range(n)]
    cache = BlockPrefixCache(16)
    cache.insert(toks, list(range(n)), [])
    t = time.perf_counter()
    for _ in range(REPS):
        blocks = cache.match(toks, n - 1)
    match_ms = (time.perf_counter() - t) / REPS * 1e3
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(list[int])
    t = time.perf_counter()
    for _ in range(REPS):
        dec.decode(enc.encode(toks))
    wire_ms = (time.perf_counter() - t) / REPS * 1e3
    t = time.perf_counter()
    for _ in range(REPS):
        BlockPrefixCache(16).insert(toks, list(range(n)), [])
    insert_ms = (time.perf_counter() - t) / REPS * 1e3
    print(
        f"{n} tokens: match {match_ms:.3f} ms ({len(blocks)} blocks), insert into an empty cache "
        f"{insert_ms:.3f} ms, msgpack round trip {wire_ms:.3f} ms"
    )
