"""Tokens each model computes, TokenRouter vs std-serving (every hop a new request to a prefix-caching
server), on the tiny example models, in-process. Routing by `bernoulli.tr` depends only on each request's
seed and position, so these counts are exact and do not depend on hardware: they are the work (tokens
through the model) that std-serving adds per hop, whatever the GPU.

    python bench/std_serving_tokens.py --p 0.1 --output-len 512 --requests 8

Prints a markdown table: per mode and model, the tokens written, the tokens presented to the engine
(std-serving: the whole sequence on every arrival), those found in the prefix cache, the tokens computed
(prefill + extend + decode = presented - cached) and, per arrival, the computed tokens beyond the written
ones (TokenRouter: the tokens the other model wrote meanwhile; std-serving adds the re-prefilled tail).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def count_tokens(engine) -> list[int]:
    """Wrap engine.forward to add up the tokens of every row it runs; returns the running [total]."""
    total = [0]
    inner = engine.forward

    def forward(batch, want_hidden=False):
        total[0] += sum(len(r.new_token_ids) for r in batch)
        return inner(batch, want_hidden)

    engine.forward = forward
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--block-sizes", default="16,1")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.runtime.messages import SamplingSpec
    from tokenrouter.runtime.modes import prepare
    from tokenrouter.runtime.offline import OfflineExecutor
    from tokenrouter.runtime.prefix_cache import BlockPrefixCache
    from tokenrouter.runtime.std_serving import StdServingScheduler, load_std_serving
    from tokenrouter.runtime.subserver.loading import load_model_runtime

    models = ROOT / "examples/models"
    res = compile_file(ROOT / "tokenrouter/stdlib/bernoulli.tr", {
        "slm_path": str(models / "tiny-small"), "llm_path": str(models / "tiny-large"), "p": str(a.p), "q": "1.0",
    })  # fmt: skip
    plan = res.plan
    for spec in plan["models"].values():
        spec["max_len"] = a.prompt_len + a.output_len + 8
    prompts = [[10 + (7 * i + 3 * j) % 190 for j in range(a.prompt_len)] for i in range(a.requests)]
    specs = [SamplingSpec(seed=i, max_tokens=a.output_len, ignore_eos=True) for i in range(a.requests)]
    rows = []

    plan1 = prepare(plan, "eager").plan  # B = 1 in both, so only the hop handling differs
    loaded = {x: load_model_runtime(plan1, x, "cpu") for x in plan1["models"]}
    counters = {x: count_tokens(e) for x, (e, _) in loaded.items()}
    ex = OfflineExecutor(
        plan1, {x: e for x, (e, _) in loaded.items()}, {x: k for x, (_, k) in loaded.items()}
    )
    out = ex.generate(prompts, specs)
    hops = sum(len(r.hops) for r in out)
    written = {x: sum(r.models.count(x) for r in out) for x in plan1["models"]}
    for x in plan1["models"]:
        rows.append(("tokenrouter", x, written[x], counters[x][0], 0, hops))
    for bs in (int(b) for b in a.block_sizes.split(",")):
        std_plan = prepare(plan, "std-serving").plan
        loaded = {x: load_std_serving(std_plan, x, "cpu") for x in std_plan["models"]}
        counters = {}
        for x, (e, _) in loaded.items():
            e.cache = BlockPrefixCache(bs)
            counters[x] = count_tokens(e)
        engines = {x: e for x, (e, _) in loaded.items()}
        ex = OfflineExecutor(std_plan, engines, {x: s.kernel for x, (_, s) in loaded.items()})
        for x, s in ex.schedulers.items():
            ex.schedulers[x] = StdServingScheduler(x, std_plan, s.engine, s.kernel, batching=s.batching.config,
                                                   clock=ex.clock)  # fmt: skip
        std_out = ex.generate(prompts, specs)
        same = [(r.token_ids, r.models) for r in std_out] == [(r.token_ids, r.models) for r in out]
        for x in std_plan["models"]:
            st = engines[x].stats()
            rows.append((f"std-serving (block {bs}){'' if same else ' DIFFERENT TOKENS'}", x, written[x],
                         counters[x][0], st["prefix_matched_tokens"], hops))  # fmt: skip
    print(f"bernoulli p = {a.p}, q = 1; {a.requests} requests, {a.prompt_len}-token prompts, "
          f"{a.output_len} tokens each; {hops} hops\n")  # fmt: skip
    print(
        "| mode | model | tokens written | tokens presented | from the prefix cache | computed "
        "| computed - written, per arrival |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for mode, x, w, presented, cached, h in rows:
        computed = presented - cached
        per = (computed - w) / (h / 2) if h else 0.0  # with q = 1 each model receives half of the hops
        print(f"| {mode} | {x} | {w} | {presented} | {cached} | {computed} | {per:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
