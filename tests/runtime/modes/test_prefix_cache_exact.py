"""The prefix cache in every mode: greedy tokens and routing traces are the same with the cache on and off (every
stdlib policy, TokenRouter mode, and the baselines), with requests that share prefixes and prompts sent twice, so
that new requests and the first arrival of a hop on the other model both start from cached blocks; cached blocks
are never written; and a soak with aborts, evictions from a tiny KV pool and mixed prefixes leaves every slot
free, cached or held (exactly one of them) in every engine."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from modes_helpers import load_lockstep, run_lockstep
from subserver_helpers import LARGE, STDLIB_DEFINES, all_free, compile_stdlib

from tokenrouter.runtime.engine.base import StepInput
from tokenrouter.runtime.engine.embedded import load_engine
from tokenrouter.runtime.messages import SamplingSpec
from tokenrouter.runtime.modes import prepare
from tokenrouter.runtime.offline import load_offline
from tokenrouter.runtime.prefix_cache import BlockPrefixCache, PrefixCachingEngine

SYSTEM = [(11 * j) % 400 + 20 for j in range(21)]  # a shared "system prompt": 5 blocks of 4 and one token
PROMPTS = [SYSTEM + [(7 * i + 5 * j) % 400 + 3 for j in range(1 + i % 5)] for i in range(6)]
PROMPTS = PROMPTS + PROMPTS[:3]  # sent again: the whole prompt is cached by then (on every model it visited)
GREEDY = [SamplingSpec(seed=i % 6, max_tokens=16, ignore_eos=True) for i in range(len(PROMPTS))]


def key(results):
    return [(r.token_ids, r.models, r.hops, r.finish_reason) for r in results]


def small_blocks(engines, size: int = 4) -> None:
    for e in engines:
        e.cache = BlockPrefixCache(size)


def run_offline(plan: dict, cache: bool, prompts=PROMPTS, sampling=GREEDY, **kw):
    ex = load_offline(plan, "cpu", prefix_cache=cache, **kw)
    engines = [s.engine for s in ex.schedulers.values()]
    if cache:
        small_blocks(engines)
    # one wave after another: the second wave's requests arrive while nothing else runs, into a warm cache
    results = ex.generate(prompts[:6], sampling[:6]) + ex.generate(prompts[6:], sampling[6:])
    return results, ex


def accounted(engine) -> None:
    """Every KV slot is exactly one of: free, in a cache block, a held request's own; every request row is free or
    a resident request's; each block's reference count is the requests that hold it."""
    pool, cache = engine.token_to_kv_pool, engine.cache
    free = pool.free_pages.tolist() + [s for t in pool._freed for s in t.tolist()]
    cached = [s for b in cache.blocks.values() for s in b.slots]
    bs, held, refs = cache.block_size, [], Counter()
    resident = [r for r in engine.reqs.values() if r.req_pool_idx]
    for req in resident:
        blocks = engine.held_blocks.get(req.rid, [])
        assert req.slots[: len(blocks) * bs] == [s for b in blocks for s in b.slots]
        assert len(req.slots) == req.kv_len
        held += req.slots[len(blocks) * bs :]
        refs.update(id(b) for b in blocks)
    assert set(engine.held_blocks) <= {r.rid for r in resident}
    every = free + cached + held
    assert len(every) == len(set(every)) == pool.size, (len(free), len(cached), len(held), pool.size)
    assert set(every) == set(range(1, pool.size + 1))
    assert all(b.refs == refs[id(b)] for b in cache.blocks.values())
    assert cache.unreferenced == sum(1 for b in cache.blocks.values() if b.refs == 0)
    rows = engine.req_to_token_pool
    assert rows.available_size() + len(resident) == rows.size


@pytest.mark.parametrize("policy", sorted(STDLIB_DEFINES))
def test_tokens_and_traces_same_with_the_cache_on_and_off(tmp_path, policy):
    plan = compile_stdlib(tmp_path, policy)
    want, _ = run_offline(plan, cache=False)
    got, ex = run_offline(plan, cache=True)
    assert key(got) == key(want)
    stats = {x: s.engine.stats() for x, s in ex.schedulers.items()}
    assert all(s["prefix_cache"] for s in stats.values())
    # the first wave arrives at once (nothing cached yet); the second finds its prompts' whole blocks
    assert stats[plan["entry"]]["prefix_matched_tokens"] >= 3 * 5 * 4
    for engine in (s.engine for s in ex.schedulers.values()):
        accounted(engine)
    assert all_free(s.engine for s in ex.schedulers.values())
    hopped = {b for r in got for _, b in r.hops} - {plan["entry"]}
    if hopped:  # a first arrival on another model matched what an earlier request left there
        assert any(stats[x]["prefix_matched_tokens"] > 0 for x in hopped)


@pytest.mark.parametrize("mode", ["llm-only", "eager", "lockstep"])
def test_baselines_same_with_the_cache_on_and_off(tmp_path, mode):
    plan = prepare(compile_stdlib(tmp_path, "bernoulli"), mode).plan
    if mode != "lockstep":
        want, _ = run_offline(plan, cache=False)
        got, ex = run_offline(plan, cache=True)
        engines = [s.engine for s in ex.schedulers.values()]
    else:
        runs = {}
        for cache in (False, True):
            core = load_lockstep(plan, prefix_cache=cache)
            if cache:
                small_blocks(s.engine for s in core.schedulers.values())
            first = run_lockstep(core, PROMPTS[:6], GREEDY[:6])
            runs[cache] = first + run_lockstep(core, PROMPTS[6:], GREEDY[6:], rid_prefix="again")
            engines = [s.engine for s in core.schedulers.values()]
        want, got = runs[False], runs[True]
    assert key(got) == key(want)
    assert sum(e.stats()["prefix_matched_tokens"] for e in engines) > 0
    for e in engines:
        accounted(e)


def test_cached_blocks_are_never_written():
    """Blocks that requests share (matched on arrival, published while running, held while a request is pending)
    keep their KV bytes while other requests extend, decode, finish and get evicted around them."""
    engine = load_engine(LARGE, engine_class=PrefixCachingEngine, max_tokens=120)
    small_blocks([engine])
    engine.forward([StepInput("a", SYSTEM)])
    for _ in range(4):
        engine.forward([StepInput("a", [7])])
    engine.release("a")
    blocks = list(engine.cache.blocks.values())
    slots = torch.tensor([s for b in blocks for s in b.slots])
    pool = engine.token_to_kv_pool
    before = [(k[slots].clone(), v[slots].clone()) for k, v in zip(pool.k_buffer, pool.v_buffer, strict=True)]
    engine.forward([StepInput("b", SYSTEM + [3, 4, 5]), StepInput("c", SYSTEM + [9])])  # both match
    assert engine.stats()["prefix_matched_tokens"] == 2 * 20
    for i in range(12):  # "b" pending (held, not stepped) while "c" runs on
        engine.forward([StepInput("c", [10 + i])])
    engine.forward([StepInput("d", SYSTEM[:9] + [1] * 30)])  # a partial match; evicts to fit
    engine.release("c")
    engine.forward([StepInput("b", [8]), StepInput("e", SYSTEM + [4])])
    after = [(k[slots], v[slots]) for k, v in zip(pool.k_buffer, pool.v_buffer, strict=True)]
    still = torch.tensor([b in engine.cache.blocks.values() for b in blocks for _ in b.slots])
    assert still[:8].all()  # the blocks the requests reference were not evicted
    for (k0, v0), (k1, v1) in zip(before, after, strict=True):
        assert torch.equal(k0[still], k1[still]) and torch.equal(v0[still], v1[still])
    accounted(engine)


def test_the_extend_after_a_match_is_an_extend_on_the_cached_prefix(monkeypatch):
    """A match leaves an ordinary extend step: the cached prefix as its prefix length, only the rest as new tokens
    (so a captured CUDA graph of that many new tokens holds it), and the same logits as a full prefill."""
    engine = load_engine(LARGE, engine_class=PrefixCachingEngine)
    small_blocks([engine])
    full = engine.forward([StepInput("a", SYSTEM + [5, 6])]).logits
    engine.release("a")
    seen = []
    run = engine._run_model
    monkeypatch.setattr(engine, "_run_model", lambda fb: seen.append(fb) or run(fb))
    out = engine.forward([StepInput("b", SYSTEM + [5, 6])])
    (fb,) = seen
    assert fb.extend_prefix_lens_cpu == (20,) and fb.extend_seq_lens_cpu == (3,) and fb.max_extend_len == 3
    assert out.stats["tokens"] == 3
    torch.testing.assert_close(out.logits, full, rtol=1e-4, atol=1e-4)


def test_soak_with_aborts_evictions_and_mixed_prefixes(tmp_path):
    """A KV pool of 160 slots per model, three prefixes and unique prompts, aborts while requests run and while
    they are pending on the other model: every slot is accounted for after every round, the requests that ran to
    the end wrote what they write with the cache off, and the engines end holding nothing."""
    plan = compile_stdlib(tmp_path, "bernoulli")
    heads = [[(13 * j + 7 * h) % 400 + 9 for j in range(12 + 10 * h)] for h in range(3)]
    prompts = [
        (heads[i % 3] if i % 4 else []) + [(5 * i + 3 * j) % 400 + 2 for j in range(2 + i % 7)]
        for i in range(30)
    ]
    sampling = [SamplingSpec(seed=i, max_tokens=10 + i % 9, ignore_eos=True) for i in range(30)]
    want = load_offline(plan, "cpu", prefix_cache=False).generate(prompts, sampling)
    ex = load_offline(plan, "cpu", max_tokens=160)
    engines = [s.engine for s in ex.schedulers.values()]
    small_blocks(engines)
    aborted = {3, 8, 13, 21, 26}
    for i, (p, s) in enumerate(zip(prompts, sampling, strict=True)):
        ex.submit(f"r{i}", p, s)
        if i % 10 == 9:  # three waves, each with aborts mid-run
            for _ in range(6):
                ex.round()
                for e in engines:
                    accounted(e)
            for a in aborted:
                ex.abort(f"r{a}")
    rounds = 0
    while ex.active:
        ex.round()
        rounds += 1
        for e in engines:
            accounted(e)
        assert rounds < 10_000
    ex._deliver()
    for i, w in enumerate(want):
        if i not in aborted:
            assert key([ex.results[f"r{i}"]]) == key([w])
    stats = [e.stats() for e in engines]
    assert (
        sum(s["prefix_evicted_blocks"] for s in stats) > 0
        and sum(s["prefix_matched_tokens"] for s in stats) > 0
    )
    for e in engines:
        accounted(e)
    assert all_free(engines)


def test_an_arrival_that_needs_a_row_keeps_its_match_when_the_held_owner_is_evicted():
    """Two request rows, both held: an arrival matching the blocks the older request published evicts that
    request for a row, and its match survives (the blocks stay cached, referenced by the arrival), with the logits
    of a full prefill."""
    engine = load_engine(LARGE, engine_class=PrefixCachingEngine, max_reqs=2)
    small_blocks([engine])
    engine.forward([StepInput("a", SYSTEM)])
    engine.forward([StepInput("b", [1, 2, 3])])
    want = load_engine(LARGE).forward([StepInput("x", SYSTEM[:20] + [4, 5])]).logits
    out = engine.forward([StepInput("c", SYSTEM[:20] + [4, 5])])
    assert engine.stats()["prefix_matched_tokens"] == 20 and not engine.resident("a") and engine.resident("c")
    torch.testing.assert_close(out.logits, want, rtol=1e-4, atol=1e-4)
    accounted(engine)
    engine.forward([StepInput("a", [6])])  # back: it matches its own published blocks
    assert engine.stats()["prefix_matched_tokens"] == 40 and engine.stats()["reprefills"] == 1
    accounted(engine)


def test_arrivals_of_one_step_sharing_an_uncached_prefix_compute_it_once():
    """Of the sequences arriving in one step, those whose uncached tokens start like an earlier one's (the same two
    blocks after the same cached prefix) wait a step, and then match its published blocks."""
    engine = load_engine(LARGE, engine_class=PrefixCachingEngine, max_tokens=400)
    small_blocks([engine])
    other = [(5 * j) % 300 + 7 for j in range(30)]
    arrivals = [
        ("a", SYSTEM + [1, 2]),
        ("b", SYSTEM + [3]),
        ("c", other),
        ("d", SYSTEM[:7] + [9] * 12),
        ("e", [4]),
    ]
    # b shares a's first blocks; d shares only 7 tokens with a (under two blocks) and e has too few to compute
    assert engine.late_shared_prefills(arrivals) == {"b"}
    engine.forward([StepInput(rid, toks) for rid, toks in arrivals if rid != "b"])
    assert engine.late_shared_prefills([("b", SYSTEM + [3])]) == set()  # a's blocks are cached now
    engine.forward([StepInput("b", SYSTEM + [3])])
    stats = engine.stats()
    assert stats["prefix_waited_rows"] == 1 and stats["prefix_matched_tokens"] == 20
    # after a cached prefix, two arrivals that continue it the same way share their next blocks again
    tail = [[8, 8, 8, 8, 6, 6, 6, 6, i] for i in range(3)]
    assert engine.late_shared_prefills([(f"t{i}", SYSTEM[:20] + t) for i, t in enumerate(tail)]) == {
        "t1",
        "t2",
    }
    accounted(engine)


def test_a_wave_of_new_requests_with_a_new_system_prompt_prefills_it_once(tmp_path):
    """Served with delayed batching, the first wave's requests arrive together: one computes the shared system
    prompt and the others match it a step later; tokens and traces are those without the cache."""
    plan = compile_stdlib(tmp_path, "bernoulli")
    want, _ = run_offline(plan, cache=False)
    got, ex = run_offline(plan, cache=True)
    assert key(got) == key(want)
    entry = ex.schedulers[plan["entry"]].engine.stats()
    assert entry["prefix_waited_rows"] >= 1
    assert entry["prefix_matched_tokens"] >= 3 * 5 * 4 + entry["prefix_waited_rows"] * 5 * 4
