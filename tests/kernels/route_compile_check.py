"""Compile the rendered Triton route kernels for sm_90 (Hopper) without a GPU: Triton's front end, its
optimiser and ptxas all run on the CPU. Catches what the interpreter cannot (typing in the compiled
dialect, constexpr branches, scalar/atomic lowering). Usage: python route_compile_check.py"""

from __future__ import annotations

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from route_cases import CASES, with_router  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tokenrouter.compiler.kernels import DEFAULT_SAMPLER, SAMPLERS, render_route_kernel  # noqa: E402
from tokenrouter.runtime.route.loader import load_source  # noqa: E402

TYPES = dict(
    stride_row="i32", V="i32", CHUNK="i32", n_rows="i32", seed_ptr="*i64", position_ptr="*i64",
    temperature_ptr="*fp32", forced_ptr="*i64", run_length_ptr="*i64", generated_ptr="*i64",
    router_ptr="*fp32", n_routers="i32", ws_f_ptr="*fp32", ws_i_ptr="*i32", ws_c_ptr="*fp32", count_ptr="*i32",
    token_ptr="*i64", logprob_ptr="*fp32", rule_ptr="*i32", feat_ptr="*fp32", LOG_V="fp32",
)  # fmt: skip
TARGET = GPUTarget("cuda", 90, 32)


def compile_kernel(fn, logits_type: str, constexprs: dict, num_warps: int):
    sig = {n: TYPES.get(n, "constexpr") for n in fn.arg_names}
    if "logits_ptr" in sig:
        sig["logits_ptr"] = logits_type
    # what a launch at vocabulary 151,936 specialises: 16-byte aligned pointers, ints divisible by 16
    aligned = {
        (i,)
        for i, n in enumerate(fn.arg_names)
        if sig[n].startswith("*") or n in ("stride_row", "V", "CHUNK")
    }
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs,
                    attrs={k: [["tt.divisibility", 16]] for k in aligned})  # fmt: skip
    return triton.compile(src, target=TARGET, options=dict(num_warps=num_warps))


def main() -> int:
    irs = {name: make() for name, make in CASES.items()}
    irs["with_router"] = with_router()
    n = 0
    for i, (name, ir) in enumerate(sorted(irs.items())):
        mod = load_source(render_route_kernel(ir, "triton"), f"check_{name}")
        # alternate the variants over the cases so that every branch compiles without compiling everything
        variants = [
            (
                "*bf16",
                dict(
                    SPLIT=8,
                    BLOCK=8192,
                    SC=2048,
                    NC=128,
                    SG=8,
                    SAMPLING=True,
                    HAS_FORCED=True,
                    EVAL_RULES=True,
                    WRITE_FEATURES=True,
                    FAST_MATH=True,
                    PREFETCH=i % 3,  # every tile pipeline: none, one and two tiles ahead
                    STAGES=3 if i % 3 == 0 else 0,  # Triton's pipeliner (cp.async), no prefetch
                ),  # fmt: skip
            ),
            (
                "*fp32",
                dict(
                    SPLIT=1,
                    BLOCK=4096,
                    SC=2048,
                    NC=128,
                    SG=8,
                    SAMPLING=i % 2 == 0,
                    HAS_FORCED=False,
                    EVAL_RULES=True,
                    WRITE_FEATURES=False,
                    FAST_MATH=True,
                    PREFETCH=1,
                    STAGES=0,
                ),
            ),  # fmt: skip
        ]
        for logits_type, constexprs in variants[: 2 if i % 3 == 0 else 1]:
            compiled = compile_kernel(mod.route_kernel, logits_type, constexprs, 8)
            assert "ptx" in compiled.asm and "cubin" in compiled.asm, name
            n += 1
        if name == "with_router" or i % 4 == 0:
            compile_kernel(mod.rules_kernel, "*fp32", {}, 1)
            n += 1
    # the cases above render the default sampler; the other one (every statistic: split merge; no
    # statistic: one program per row) and the benchmarks' debug tails of both samplers (bf16, split 4, as
    # --tail-split launches them at bs 64)
    (other,) = (s for s in SAMPLERS if s != DEFAULT_SAMPLER)
    ir = irs["citer_like"]
    sampled = dict(SPLIT=4, BLOCK=4096, SC=2048, NC=128, SG=8, SAMPLING=True, HAS_FORCED=True, EVAL_RULES=True,
                   WRITE_FEATURES=False, FAST_MATH=True, PREFETCH=1, STAGES=0)  # fmt: skip
    for sampler, tail, logits_type, changes in (
        (other, "full", "*bf16", {}),
        (other, "full", "*fp32", dict(SPLIT=1, HAS_FORCED=False)),
        (other, "full", "*bf16", dict(BLOCK=8192, PREFETCH=0, STAGES=3)),
        ("strided", "chunk", "*bf16", {}),
        ("strided", "none", "*bf16", {}),
        ("cdf", "chunk", "*bf16", {}),
        ("cdf", "none", "*bf16", {}),
    ):
        src = render_route_kernel(ir, "triton", sampler=sampler, debug_tail=tail)
        mod = load_source(src, f"check_{sampler}_{tail}")
        compiled = compile_kernel(mod.route_kernel, logits_type, {**sampled, **changes}, 8)
        assert "ptx" in compiled.asm and "cubin" in compiled.asm, (sampler, tail)
        n += 1
    print(f"OK compiled {n} kernels for sm_90")
    return 0


if __name__ == "__main__":
    sys.exit(main())
