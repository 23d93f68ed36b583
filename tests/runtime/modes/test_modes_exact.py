"""The baselines route exactly like TokenRouter: under greedy decoding and when sampling, lockstep and
std-serving write the same tokens, by the same models, with the same hand-offs, as the in-process executor of
the tokenrouter mode (itself checked against the sequential reference in
tests/runtime/subserver/test_subserver_exact.py); llm-only writes every token on the large model, and when
sampling the same tokens as the engine's own offline generation (the route kernel and `sample` draw with the
same default sampler)."""

from __future__ import annotations

import pytest
from modes_helpers import load_lockstep, load_std, run_lockstep
from subserver_helpers import all_free, compile_policy, compile_stdlib

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.engine.generate import generate
from tokenrouter.runtime.messages import SamplingSpec
from tokenrouter.runtime.modes import ModeError, largest_model, prepare
from tokenrouter.runtime.offline import load_offline
from tokenrouter.runtime.sampling import SamplingParams

PROMPTS = [[(7 * i + j * 5) % 500 + 3 for j in range(2 + i % 6)] for i in range(8)]
GREEDY = [SamplingSpec(seed=i, max_tokens=24, ignore_eos=True) for i in range(8)]
SAMPLED = [  # temperature rows, some with top-k / top-p (the route kernel's separate path)
    SamplingSpec(
        temperature=(0.9, 1.3)[i % 2],
        top_k=(0, 0, 20)[i % 3],
        top_p=(1.0, 0.8)[i % 4 == 1],
        seed=500 + i,
        max_tokens=16,
        ignore_eos=True,
    )  # fmt: skip
    for i in range(8)
]
PLANS = {
    "bernoulli": lambda tmp: compile_stdlib(tmp, "bernoulli"),
    "r2r": lambda tmp: compile_stdlib(tmp, "r2r"),
    "r_stitch": lambda tmp: compile_stdlib(tmp, "r_stitch"),
    "for_k": lambda tmp: compile_policy(tmp, "for_k", batch={"a": 3, "b": 2}),
    "three": lambda tmp: compile_policy(tmp, "three", batch={"a": 3, "b": 2}),
}


def key(results):
    return [(r.token_ids, r.models, r.hops, r.finish_reason) for r in results]


@pytest.mark.parametrize("policy", sorted(PLANS))
def test_lockstep_and_std_serving_equal_tokenrouter(tmp_path, policy):
    plan = PLANS[policy](tmp_path)
    want = load_offline(plan, "cpu").generate(PROMPTS, GREEDY)
    assert sum(len(r.hops) for r in want) > 0  # the policy really routes on these prompts
    core = load_lockstep(plan)
    assert key(run_lockstep(core, PROMPTS, GREEDY)) == key(want)
    assert all_free(s.engine for s in core.schedulers.values())
    std = load_std(plan, block_size=4)
    assert key(std.generate(PROMPTS, GREEDY)) == key(want)


def test_lockstep_and_std_serving_equal_tokenrouter_when_sampling(tmp_path):
    plan = PLANS["for_k"](tmp_path)
    want = load_offline(plan, "cpu").generate(PROMPTS, SAMPLED)
    assert sum(len(r.hops) for r in want) > 0
    assert key(want) != key(load_offline(plan, "cpu").generate(PROMPTS, GREEDY))  # the draws matter
    assert key(run_lockstep(load_lockstep(plan), PROMPTS, SAMPLED)) == key(want)
    assert key(load_std(plan, block_size=4).generate(PROMPTS, SAMPLED)) == key(want)


def test_llm_only_sampled_equals_engine_generate(tmp_path):
    """One model, no hand-offs: the executor's tokens (drawn by the route kernel) are the engine's own
    offline generation's (drawn by `sample`) for the same seeds, so both use the same default sampler."""
    plan = prepare(compile_stdlib(tmp_path, "r2r"), "llm-only").plan
    ex = load_offline(plan, "cpu")
    got = [r.token_ids for r in ex.generate(PROMPTS, SAMPLED)]
    params = [SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed,
                             max_tokens=s.max_tokens, ignore_eos=True) for s in SAMPLED]  # fmt: skip
    assert got == [g.token_ids for g in generate(ex.schedulers["llm"].engine, PROMPTS, params)]


def test_lockstep_runs_the_large_model_in_the_same_global_step(tmp_path):
    """A row the small model hands over (drop) is written by the large model before the next global step:
    with `-> b drop` and `b -> a`, every step of b follows a step of a in the same global step."""
    core = load_lockstep(compile_policy(tmp_path, "drop"))
    a, b = core.schedulers["a"], core.schedulers["b"]
    for i, p in enumerate(PROMPTS):
        core.handle(m.NewRequest(f"r{i}", p, GREEDY[i], i + 1))
    seen_b = 0
    for _ in range(12):
        steps_a, steps_b = a.recorder.steps, b.recorder.steps
        core.step()
        assert a.recorder.steps == steps_a + 1  # the small model runs every global step, on all it holds
        assert not b.runnable and not any(r.runnable for r in b.reqs.values())  # nothing left waiting on b
        seen_b += b.recorder.steps - steps_b
    assert seen_b > 0


def test_lockstep_makes_each_models_device_current(tmp_path, monkeypatch):
    """With one model per GPU the lockstep process steps engines on two devices; Triton and CUDA graphs use
    the current one, so every forward and release of a model runs with that model's device current."""
    from fake_devices import record_scopes

    import tokenrouter.runtime.baselines.lockstep as lockstep

    current = record_scopes(monkeypatch, lockstep)
    core = load_lockstep(compile_policy(tmp_path, "drop"))
    calls = []
    for name, s in core.schedulers.items():
        eng, fake = s.engine, f"cuda:{len(calls)}-{name}"
        calls.append(fake)
        forward, release = eng.forward, eng.release

        def check(fn, fake=fake):
            def wrapped(*a, **k):
                assert current[0] == fake, (current[0], fake)
                calls.append(fake)
                return fn(*a, **k)

            return wrapped

        core.devices[name] = fake
        monkeypatch.setattr(eng, "forward", check(forward))
        monkeypatch.setattr(eng, "release", check(release))
    results = run_lockstep(core, PROMPTS, GREEDY)
    assert all(r.finish_reason for r in results)
    assert {c for c in calls[2:]} == {"cuda:0-a", "cuda:1-b"}  # both models ran, each on its own device
    assert current[0] is None


def test_std_serving_reuses_cached_prefixes(tmp_path):
    """Hops are new requests: the sender forgets the request and its KV goes to the prefix cache; the
    receiver matches the cached prefix and prefills only the rest. The counters add up, the cache holds
    every page that is not free, and a cache too coarse to match anything (block 64) matches nothing."""
    plan = compile_policy(tmp_path, "keep")
    ex = load_std(plan, block_size=4)
    res = ex.generate(PROMPTS, GREEDY)
    hops = sum(len(r.hops) for r in res)
    assert hops > 0
    stats = {x: s.engine.stats() for x, s in ex.schedulers.items()}
    matched = sum(s["prefix_matched_tokens"] for s in stats.values())
    computed = sum(s["prefix_computed_tokens"] for s in stats.values())
    assert sum(s["prefix_arrivals"] for s in stats.values()) == len(PROMPTS) + hops
    # every arrival presents its whole sequence: the prompt, then at a hop (keep: the hop follows the
    # token that changes hands) the prompt and every token generated so far
    presented = 0
    for r in res:
        changes = [i for i in range(len(r.models) - 1) if r.models[i] != r.models[i + 1]]
        assert len(changes) == len(r.hops)
        presented += len(r.prompt_ids) * (1 + len(changes)) + sum(i + 1 for i in changes)
    assert matched + computed == presented
    assert matched > computed / 4  # returns find most of their sequence in the cache
    # the step counters (`tokenrouter_step_tokens_total`, the matrix's tokens per step) count what the engine
    # ran, not what was presented: an arrival's unmatched tokens, then one token per step while held
    scheds = ex.schedulers.values()
    arrivals = sum(s["prefix_arrivals"] for s in stats.values())
    rows = sum(s.recorder.rows_total for s in scheds)
    assert sum(s.recorder.new_tokens_total for s in scheds) == computed + rows - arrivals
    assert sum(k for x in scheds for _, _, k in x.stats().tables.by_bs.values()) == computed + rows - arrivals
    # and so is a step's shape (`q`, its longest row's new tokens rounded up to a power of two): every step of a
    # shape ran a row of more than q / 2 tokens (before, an arrival's whole sequence set it)
    for s in scheds:
        for (_, q, _), (n, _, tokens) in s.recorder.shape_ms.items():
            assert tokens >= n * (q // 2 + 1), (s.model, q, n, tokens)
    for s in stats.values():
        assert s["requests"] == 0 and s["pages_free"] + s["prefix_cached_tokens"] == s["pages_total"]
    coarse = load_std(plan, block_size=64).generate(PROMPTS, GREEDY)
    assert key(coarse) == key(res)


def test_llm_only_writes_every_token_on_the_large_model(tmp_path):
    plan = compile_stdlib(tmp_path, "r2r")
    assert largest_model(plan) == "llm"  # tiny-large has more parameters than tiny-small
    setup = prepare(plan, "llm-only")
    assert list(setup.plan["models"]) == ["llm"] and setup.plan["entry"] == "llm"
    assert setup.plan["models"]["llm"]["batch"] == 1
    res = load_offline(setup.plan, "cpu").generate(PROMPTS[:4], GREEDY[:4])
    assert all(r.models == ["llm"] * 24 and not r.hops for r in res)
    chosen = prepare(plan, "llm-only", llm="slm").plan  # --llm picks another model explicitly
    assert list(chosen["models"]) == ["slm"]
    with pytest.raises(ModeError, match="not a model of the plan"):
        prepare(plan, "llm-only", llm="big")


def test_mode_plans(tmp_path):
    plan = compile_policy(tmp_path, "keep", batch={"a": 3, "b": 2})
    for mode in ("eager", "lockstep", "std-serving"):
        assert {x: s["batch"] for x, s in prepare(plan, mode).plan["models"].items()} == {"a": 1, "b": 1}
    same = prepare(plan, "no-graphs")
    assert same.plan is plan and same.engine_overrides == {"cuda_graph": False}
    assert prepare(plan, "tokenrouter").plan is plan
    assert prepare(plan, "lockstep").lockstep and prepare(plan, "std-serving").scheduler == "std-serving"
    with pytest.raises(ModeError, match="unknown mode"):
        prepare(plan, "fast")
    with pytest.raises(ModeError, match="--llm applies"):
        prepare(plan, "eager", llm="a")


def test_serve_batch_replaces_thresholds(tmp_path):
    """`serve --batch MODEL=B`: those models' thresholds replaced, the others as the plan has them, checked
    for deadlock at the plan's concurrency (16), in the modes that batch at all."""
    plan = compile_policy(tmp_path, "keep", batch={"a": 3, "b": 2})
    for mode in ("tokenrouter", "no-graphs"):
        setup = prepare(plan, mode, batch={"b": 5})
        assert {x: s["batch"] for x, s in setup.plan["models"].items()} == {"a": 3, "b": 5}
    assert plan["models"]["b"]["batch"] == 2  # the plan itself is left alone
    with pytest.raises(
        ModeError, match=r"--batch: delayed batching can deadlock: .*\(a batch 3, b batch 15\)"
    ):
        prepare(plan, "tokenrouter", batch={"b": 15})
    with pytest.raises(ModeError, match=r"--batch big: not a model of the plan \(models: a, b\)"):
        prepare(plan, "tokenrouter", batch={"big": 2})
    with pytest.raises(ModeError, match="--batch b=0: a threshold is an int >= 1"):
        prepare(plan, "tokenrouter", batch={"b": 0})
    with pytest.raises(ModeError, match="--batch applies to --mode tokenrouter and no-graphs"):
        prepare(plan, "eager", batch={"b": 2})


def test_std_serving_under_memory_pressure(tmp_path):
    """A KV pool of 96 slots for 8 requests of up to 31 tokens: the prefix cache gives blocks back (and the
    engine evicts held requests) to make room; the tokens do not change and no slot leaks."""
    plan = compile_policy(tmp_path, "keep")
    want = load_offline(plan, "cpu").generate(PROMPTS, GREEDY)
    ex = load_std(plan, block_size=4, max_tokens=96)
    assert key(ex.generate(PROMPTS, GREEDY)) == key(want)
    stats = [s.engine.stats() for s in ex.schedulers.values()]
    assert sum(s["prefix_evicted_blocks"] for s in stats) > 0
    assert sum(s["prefix_matched_tokens"] for s in stats) > 0
    for s in stats:
        assert s["pages_total"] == 96 and s["pages_free"] + s["prefix_cached_tokens"] == 96
