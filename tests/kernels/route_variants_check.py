"""The Triton route kernel's launch variants (`LaunchOptions`: prefetch distance, Triton pipeline stages,
warps, programs per SM) under Triton's interpreter, on rows of several tiles: each variant must give the
plain loop's results (prefetch 0, stages 0, the same split and tile) bit for bit, and the torch renderer's
within route_interp_check's tolerances. Run as a script in a fresh process (TRITON_INTERPRET=1 must be set
before triton is imported); test_route_triton_variants.py runs it. Usage:
python route_variants_check.py PREFETCH [STAGES [WARPS]] [cuda] [cdf|strided] (the sampler of both renderers,
default tokenrouter.runtime.sampling.DEFAULT_SAMPLER); PREFETCH may list several distances ("1,2"): each is
checked against the same plain-loop results, computed once. Exits non-zero at the first mismatch."""

from __future__ import annotations

import os
import sys

if "cuda" not in sys.argv[1:]:
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import triton_interp

    triton_interp.install()  # tests/triton_interp.py: one patch of triton.language per kernel run
else:
    os.environ.pop("TRITON_INTERPRET", None)  # compiled for real, whatever the caller's environment says

import torch  # noqa: E402
from route_cases import CASES  # noqa: E402
from route_inputs import extreme_logits, mixed_state, random_logits, tie_logits  # noqa: E402
from route_interp_check import compare  # noqa: E402

from tokenrouter.runtime.route import RouteBatchState, RouteKernel  # noqa: E402
from tokenrouter.runtime.sampling import DEFAULT_SAMPLER  # noqa: E402

# (split, block, logits): one or two programs per row, one or two sampling chunks per tile
VARIANTS = ((1, 2048, torch.float32), (2, 2048, torch.bfloat16), (2, 4096, torch.float32))
FIELDS = ("seed", "position", "temperature", "top_k", "top_p", "run_length", "generated")


def bitwise_equal(a, b, label: str) -> None:
    for name in ("token", "logprob", "rule"):
        x, y = getattr(a, name).cpu(), getattr(b, name).cpu()
        assert torch.equal(x, y), f"{label}: {name} {x.tolist()} != {y.tolist()}"
    for name, x in a.features.items():
        y = b.features[name].cpu()
        same = torch.equal(x.cpu().view(torch.int32), y.view(torch.int32)) if x.dtype == torch.float32 else (
            torch.equal(x.cpu(), y))  # fmt: skip
        assert same, f"{label}: feature {name} differs in its bits: {x.tolist()} != {y.tolist()}"


def main() -> int:
    args = [a for a in sys.argv[1:] if a not in ("cuda", "cdf", "strided")]
    device = "cuda" if "cuda" in sys.argv[1:] else "cpu"
    sampler = next((a for a in sys.argv[1:] if a in ("cdf", "strided")), DEFAULT_SAMPLER)
    prefetches = [int(p) for p in args[0].split(",")]
    stages = int(args[1]) if len(args) > 1 else 0
    warps = int(args[2]) if len(args) > 2 else None
    # vocab 13,000: 6 full chunks of 2048 ids and a partial one; at block 2048 and split 2 a program has 4 or
    # 2 full tiles and a partial one, so the pipeline fills, rotates and drains (prefetch 2 needs >= 3 tiles).
    # 8 rows: every row of mixed_state's pattern (greedy, T = 1 and T != 1 sampled, top-k / top-p) and every
    # special row of extreme_logits (0-5); under the interpreter each row's programs cost the same, so rows
    # repeating the pattern would only add time
    rows, vocab = 8, 13_000
    checked = 0
    for name in ("citer_like", "bernoulli_split"):  # every statistic; uniform() and no statistic
        plan = {"routes": {"slm": CASES[name]()}, "routers": {}, "models": {}}
        ref = RouteKernel(plan, "slm", "torch", device, sampler=sampler)
        for split, block, dtype in VARIANTS:
            plain = RouteKernel(plan, "slm", "triton", device, split=split, block=block, sampler=sampler)
            plain._triton.options.prefetch = 0
            tris = {}
            for prefetch in prefetches:
                tri = RouteKernel(
                    plan, "slm", "triton", device, split=split, block=block, warps=warps, sampler=sampler
                )
                tri._triton.options.prefetch, tri._triton.options.stages = prefetch, stages
                interpreted = type(tri._triton.module.route_kernel).__name__ == "InterpretedFunction"
                assert interpreted == (device == "cpu"), (
                    f"{device}: the kernel is {type(tri._triton.module.route_kernel)}"
                )
                tris[prefetch] = tri
            for maker in (random_logits, tie_logits, extreme_logits):
                logits = maker(rows, vocab, seed=split + block).to(dtype).to(device)
                logits[4:] *= torch.linspace(0.2, 2.0, rows - 4)[:, None].to(dtype).to(device)
                host = mixed_state(rows, restricted=maker is random_logits)
                state = RouteBatchState(*[getattr(host, f).to(device) for f in FIELDS])
                a = ref(logits, None, state, with_features=True)
                b = plain(logits, None, state, with_features=True)
                for prefetch, tri in tris.items():
                    label = f"{name} split={split} block={block} {dtype} {maker.__name__} prefetch={prefetch}"
                    c = tri(logits, None, state, with_features=True)
                    bitwise_equal(b, c, label)
                    compare(a, c, None, label)
                    checked += 1
    print(f"OK {checked} comparisons (prefetch {','.join(map(str, prefetches))}, stages {stages}, "
          f"warps {warps or 'default'}, sampler {sampler})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
