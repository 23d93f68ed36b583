"""On a CUDA machine with SGLang: one policy run with the large model on SGLang against the same plan on the
embedded engine (greedy), plus aborts that must free SGLang's KV.

Writes two random-weight model folders (small and large, safetensors, so both engines load the same weights),
then for one routing policy (--policy: R-Stitch, its entropy threshold set to the median normalized entropy of
the small model on the prompts so that both directions of hand-off happen; or bernoulli p = 0.3). One policy
per invocation: a process holds one SGLang model.
1. runs every prompt at once through the in-process executor (the subserver schedulers, delayed batching,
   hops) with both models on the embedded engine, then with `engine: "sglang"` on the large model;
2. reports per request the share of positions where token and writing model agree, and the first divergence
   (bf16 kernels differ, so a greedy near-tie can flip a token; everything after it then differs);
3. submits more requests, aborts them mid-run, and checks that every engine's pool is whole again.
Prints a JSON summary (and writes it to --out/sglang_check.json). Exits 3 without SGLang or CUDA.

    python bench/sglang_check.py --out /tmp/sglang_check
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tokenrouter.runtime import messages as m  # noqa: E402
from tokenrouter.runtime.engine.make_model import make_model, shape_for  # noqa: E402
from tokenrouter.runtime.offline import load_offline, plan_from_path  # noqa: E402

SMALL = dict(hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, head_dim=64)
LARGE = dict(hidden=512, intermediate=1024, layers=4, heads=8, kv_heads=4, head_dim=64)

POLICY = """policy check "sglang check"
param p: float = 0.3
param threshold: float = 0.5
model slm = "{slm}" {{ gpu: 0, batch: 2, mem: 0.1 }}
model llm = "{llm}" {{ gpu: 0, batch: 1, mem: 0.1{engine} }}
serve {{ concurrency: 8, max_delay_ms: 5 }}
entry slm
route slm {{
  {slm_rule}
}}
route llm {{
  {llm_rule}
}}
"""
RULES = {
    "bernoulli": ("when uniform() < p -> llm", "-> slm"),
    "r_stitch": ("when norm_entropy > threshold -> llm drop", "when norm_entropy <= threshold -> slm"),
}


def write_policy(out: Path, name: str, slm: Path, llm: Path, sglang: bool) -> Path:
    slm_rule, llm_rule = RULES[name]
    text = POLICY.format(slm=slm, llm=llm, engine=', engine: "sglang"' if sglang else "",
                         slm_rule=slm_rule, llm_rule=llm_rule)  # fmt: skip
    path = out / f"{name}-{'sglang' if sglang else 'embedded'}.tr"
    path.write_text(text)
    return path


def median_norm_entropy(slm: Path, prompts: list[list[int]]) -> float:
    from tokenrouter.runtime.engine.base import StepInput
    from tokenrouter.runtime.engine.embedded import load_engine

    eng = load_engine(slm, device="cuda", dtype="bfloat16", max_tokens=4096)
    logits = eng.forward([StepInput(f"p{i}", p) for i, p in enumerate(prompts)]).logits.float()
    ent = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1) / math.log(logits.shape[-1])
    del eng
    return float(ent.median())


def run_policy(path: Path, prompts, sampling, defines: dict) -> tuple[list, dict]:
    plan = plan_from_path(str(path), defines)
    ex = load_offline(plan)
    t0 = time.perf_counter()
    results = ex.generate(prompts, sampling)
    wall = time.perf_counter() - t0
    # aborts mid-run must free every pool
    for i, p in enumerate(prompts[:4]):
        ex.submit(f"abort-{i}", p, sampling)
    for _ in range(6):
        ex.round()
    for i in range(4):
        ex.abort(f"abort-{i}")
    ex.run()
    pools = {}
    for name, s in ex.schedulers.items():
        st = s.engine.stats()
        pools[name] = {k: st.get(k) for k in ("pages_total", "pages_free", "requests", "held", "cuda_graph",
                                               "graph_steps", "steps", "sglang")}  # fmt: skip
    del ex
    gc.collect()
    torch.cuda.empty_cache()
    return results, {"wall_s": wall, "pools": pools}


def agreement(a, b) -> dict:
    per = []
    for ra, rb in zip(a, b, strict=True):
        n = min(len(ra.token_ids), len(rb.token_ids))
        same = [ra.token_ids[i] == rb.token_ids[i] and ra.models[i] == rb.models[i] for i in range(n)]
        first = next((i for i, s in enumerate(same) if not s), None)
        per.append({"agree": sum(same) / max(n, 1), "first_divergence": first, "tokens": n,
                    "llm_share_embedded": ra.models.count("llm") / max(len(ra.models), 1),
                    "llm_share_sglang": rb.models.count("llm") / max(len(rb.models), 1),
                    "errors": [ra.error, rb.error]})  # fmt: skip
    return {"mean_agree": sum(p["agree"] for p in per) / len(per), "per_request": per}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--policy", default="r_stitch", choices=sorted(RULES))
    args = ap.parse_args(argv)
    if importlib.util.find_spec("sglang") is None or not torch.cuda.is_available():
        print("sglang check skipped: needs SGLang and a CUDA device (docs/sglang.md)", file=sys.stderr)
        return 3
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slm, llm = out / "slm", out / "llm"
    make_model(slm, shape_for("tiny", **SMALL), seed=1, weights=True, force=True)
    make_model(llm, shape_for("tiny", **LARGE), seed=2, weights=True, force=True)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(8, 40))] for _ in range(args.prompts)]
    sampling = m.SamplingSpec(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    defines = {"threshold": repr(median_norm_entropy(slm, prompts))}
    a, info_a = run_policy(write_policy(out, args.policy, slm, llm, False), prompts, sampling, defines)
    b, info_b = run_policy(write_policy(out, args.policy, slm, llm, True), prompts, sampling, defines)
    summary = {"policy": args.policy, "threshold": defines["threshold"], "prompts": args.prompts,
               "max_tokens": args.max_tokens}  # fmt: skip
    summary |= agreement(a, b) | {"embedded": info_a, "sglang": info_b}
    text = json.dumps(summary, indent=1)
    (out / "sglang_check.json").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
