"""In-process drivers of the baselines, playing the frontend's part (as OfflineExecutor does)."""

from __future__ import annotations

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.baselines.lockstep import LockstepCore
from tokenrouter.runtime.baselines.std_serving import StdServingScheduler, load_std_serving
from tokenrouter.runtime.modes import prepare
from tokenrouter.runtime.offline import OfflineExecutor, RequestResult
from tokenrouter.runtime.subserver.loading import load_model_runtime


def load_lockstep(plan: dict, **engine_overrides) -> LockstepCore:
    plan = prepare(plan, "lockstep").plan
    loaded = {x: load_model_runtime(plan, x, "cpu", **engine_overrides) for x in plan["models"]}
    return LockstepCore(plan, {x: e for x, (e, _) in loaded.items()}, {x: k for x, (_, k) in loaded.items()})


def run_lockstep(core: LockstepCore, prompts, sampling, rid_prefix: str = "r") -> list[RequestResult]:
    """Submit every prompt at once and run global steps until all finish."""
    results = {f"{rid_prefix}{i}": RequestResult(f"{rid_prefix}{i}", list(p)) for i, p in enumerate(prompts)}
    active = set(results)
    for i, (rid, res) in enumerate(results.items()):
        assert not core.handle(m.NewRequest(rid, res.prompt_ids, sampling[i], i + 1))
    while active:
        assert core.ready()
        out = core.step()
        for _, msg in out:
            for t in msg.tokens:
                res = results[t.rid]
                assert t.index == len(res.token_ids)
                res.token_ids.extend(t.token_ids)
                res.models.extend([t.model] * len(t.token_ids))
                if t.hop_to is not None:
                    res.hops.append((t.model, t.hop_to))
            for f in msg.finished:
                results[f.rid].finish_reason = f.reason
                active.discard(f.rid)
                core.handle(m.Release(f.rid))
    return list(results.values())


def load_std(plan: dict, block_size: int = 16, **engine_overrides) -> OfflineExecutor:
    """The executor with std-serving schedulers and prefix-caching engines."""
    from tokenrouter.runtime.prefix_cache import BlockPrefixCache

    plan = prepare(plan, "std-serving").plan
    loaded = {x: load_std_serving(plan, x, "cpu", engine_overrides) for x in plan["models"]}
    for engine, _ in loaded.values():
        engine.cache = BlockPrefixCache(block_size)
    ex = OfflineExecutor(
        plan, {x: e for x, (e, _) in loaded.items()}, {x: s.kernel for x, (_, s) in loaded.items()}
    )
    for x, s in ex.schedulers.items():  # the executor built plain schedulers: use the std-serving ones
        ex.schedulers[x] = StdServingScheduler(
            x, plan, s.engine, s.kernel, batching=s.batching.config, clock=ex.clock
        )
    return ex
