"""Every Triton kernel of the GPU path compiles for the H200 (sm_90), checked on any machine: Triton's
bundled ptxas builds the cubins without a GPU. Catches kernels that only run under the interpreter.

The compile runs in a fresh interpreter process (a process that loaded Triton in interpreter mode, as
this package's conftest does without CUDA, cannot also compile). On every machine each kernel compiles in
each of its code paths (the constexpr switches: PDL, prefetch, fused merge, eager loads, norm, SiLU, trace)
with one tile shape each, about 30 compiles; every tile shape the engine can pick (about 150, 100 s on two
idle cores) compiles where CUDA is (`gpu`). Neither has a time limit: a loaded machine only makes them slower."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow


def compile_all(full: bool = False) -> list[str]:
    """Compile each kernel in each code path (`full`: in every tile configuration too); returns what was
    compiled."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tokenrouter.runtime.engine.kernels import attention as ka
    from tokenrouter.runtime.engine.kernels import attention_shapes as ks
    from tokenrouter.runtime.engine.kernels import dot_rows as kd
    from tokenrouter.runtime.engine.kernels import elementwise as ke
    from tokenrouter.runtime.engine.kernels import linear as kl

    target = GPUTarget("cuda", 90, 32)
    done = []

    def jit(kernel):
        while not isinstance(kernel, triton.runtime.JITFunction):
            kernel = kernel.fn  # under an autotuner
        return kernel

    def build(kernel, pointers, scalars, consts, num_warps=4, num_stages=2):
        given = {**pointers, **scalars, **dict.fromkeys(consts, "constexpr")}
        sig = {name: given[name] for name in jit(kernel).arg_names if name in given}  # in the kernel's order
        src = ASTSource(fn=jit(kernel), signature=sig, constexprs=consts)
        options = {"num_warps": num_warps, "num_stages": num_stages}
        if consts.get("USE_PDL"):
            options["launch_pdl"] = True
        triton.compile(src, target=target, options=options)
        done.append(f"{jit(kernel).__name__} {consts} warps={num_warps} stages={num_stages}")

    ptrs = dict(Q="*bf16", K_buf="*bf16", V_buf="*bf16", Out="*bf16", Mid_O="*fp32", Mid_LSE="*fp32",
                Tickets="*i32", req_to_token="*i32", req_pool_indices="*i64", seq_lens="*i64", extend_start_loc="*i64",
                extend_lens="*i64")  # fmt: skip
    scalars = {"qk_scale": "fp32"}
    for name in ("qt", "qh", "kt", "kh", "vt", "vh", "ot", "oh", "mt", "mh", "ms", "lt", "lh", "r2t"):
        scalars[f"stride_{name}"] = "i32"
    scalars["num_row_blocks"] = "i32"
    # decode rows (1 stage, the widest split), 32-row extend blocks (3 stages), a prefill (no split)
    # and the decode one with the kernel's first load order; with programmatic dependent launch and the
    # first tile read before the wait: decode and a 32-row extend
    # and the split merge fused in (decode and a 16-row extend, with PDL and prefetch, and a plain decode)
    attention = [
        (2, 16, ks.MAX_SPLITS, 1, True, False, False),
        (4, 32, 4, 3, True, False, False),
        (4, 64, 1, 2, True, False, False),
        (2, 16, ks.MAX_SPLITS, 1, False, False, False),
        (2, 16, ks.MAX_SPLITS, 1, True, True, False),
        (4, 32, 4, 3, True, True, False),
        (2, 16, ks.MAX_SPLITS, 1, True, True, True),
        (2, 16, ks.MAX_SPLITS, 2, True, True, True),
        (2, 16, ks.MAX_SPLITS, 1, True, False, True),
        (2, 16, 8, 2, True, True, True),  # the one-pass merges of 16-row blocks (fused_merge_rows 8, 16)
        (2, 16, 2, 2, True, True, True),
        (2, 16, 8, 2, True, True, True, 128),  # the backend's KV tiles: 128 tokens at few splits, 32 at many
        (4, 32, 2, 2, True, True, True, 128),
        (2, 16, 1, 2, True, True, False, 128),
        (2, 16, 32, 2, True, True, True, 32),
        (4, 32, 32, 2, True, True, True, 32),
    ]
    if not full:  # split decode, prefill, plain loads, PDL with the fused merge, 32-row blocks of 128 tokens
        attention = [attention[i] for i in (0, 2, 3, 6, 12)]
    for group, block_m, splits, stages, eager, pdl, fused, *rest in attention:
        block_n = rest[0] if rest else 64
        merge_rows = ks.fused_merge_rows(block_m, splits, 128, 4, 1) if block_m == 16 and fused else 2
        consts = dict(GROUP=group, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=block_m, BLOCK_N=block_n, NUM_SPLITS=splits,
                      IEEE=False, EAGER_LOADS=eager, USE_PDL=pdl, PREFETCH=pdl, FUSED_MERGE=fused,
                      BLOCK_S=splits if fused else 2, MERGE_ROWS=merge_rows)  # fmt: skip
        build(ka._paged_attn_kernel, ptrs, scalars, consts, num_stages=stages)
    for eager, pdl in ((True, False), (False, False), (True, True)):
        build(
            ka._merge_splits_kernel,
            dict(Mid_O="*fp32", Mid_LSE="*fp32", Out="*bf16"),
            {f"stride_{n}": "i32" for n in ("mt", "mh", "ms", "lt", "lh", "ot", "oh")},
            dict(
                HEAD_DIM=128,
                BLOCK_D=128,
                NUM_SPLITS=ks.MAX_SPLITS,
                BLOCK_S=ks.MAX_SPLITS,
                EAGER_LOADS=eager,
                USE_PDL=pdl,
            ),  # fmt: skip
        )
    gemv_variants = [
        (cfg, variant)
        for cfg in kl._GEMV_CONFIGS[
            : None if full else 1
        ]  # every tile shape, with SiLU*up, and with add & RMSNorm
        for variant in (
            dict(SILU_MUL=True, NORM=False, HAS_RES=False, USE_PDL=False),
            dict(SILU_MUL=False, NORM=True, HAS_RES=True, USE_PDL=False),
        )
    ]
    gemv_variants.append((kl._GEMV_CONFIGS[0], dict(SILU_MUL=False, NORM=True, HAS_RES=True, USE_PDL=True)))
    for cfg, variant in gemv_variants:
        build(
            kl._gemv_kernel,
            dict(X="*bf16", W="*bf16", Bias="*bf16", Y="*bf16", R="*bf16", R_out="*bf16", NW="*bf16"),
            dict(N="i32", K="i32", stride_wn="i32", eps="fp32"),
            dict(HAS_BIAS=True, **variant, **cfg.kwargs),
            cfg.num_warps,
            cfg.num_stages,
        )
    variants = [
        (bm, cfg, variant)
        for bm, cfgs in kl._GEMV_FEW_CONFIGS.items()  # the few-row kernel: every row count and tile shape
        if full or bm == 2  # (test_few_row_gemv_keeps_rows_in_registers_on_sm90 compiles each row count)
        for cfg in cfgs[: None if full else 1]
        for variant in (
            dict(SILU_MUL=True, NORM=False, HAS_RES=False, USE_PDL=False),
            dict(SILU_MUL=False, NORM=True, HAS_RES=True, USE_PDL=False),
        )
    ]
    variants.append(
        (8, kl._GEMV_FEW_CONFIGS[8][0], dict(SILU_MUL=False, NORM=True, HAS_RES=True, USE_PDL=True))
    )
    for bm, cfg, variant in variants:
        build(
            kl._gemv_few_kernel,
            dict(X="*bf16", W="*bf16", Bias="*bf16", Y="*bf16", R="*bf16", R_out="*bf16", NW="*bf16"),
            dict(M="i32", N="i32", K="i32", stride_x="i32", stride_wn="i32", eps="fp32"),
            dict(HAS_BIAS=True, BLOCK_M=bm, **variant, **cfg.kwargs),
            cfg.num_warps,
            cfg.num_stages,
        )
    dot_variants = [  # the tensor-core few-row kernel: every tile config with SiLU*up, with add & norm, and
        (cfg, variant)  # plain with PDL and the first weight tile read before the wait (the engine's default)
        for cfg in kd._DOT_ROWS_CONFIGS[: None if full else 1]
        for variant in (
            dict(SILU_MUL=True, NORM=False, HAS_RES=False, USE_PDL=False, PREFETCH_W=False),
            dict(SILU_MUL=False, NORM=True, HAS_RES=True, USE_PDL=False, PREFETCH_W=False),
            dict(SILU_MUL=False, NORM=False, HAS_RES=False, USE_PDL=True, PREFETCH_W=True),
        )
    ]
    dot_variants += [
        (kd._DOT_ROWS_CONFIGS[0], dict(SILU_MUL=False, NORM=True, HAS_RES=True, USE_PDL=True, PREFETCH_W=p))
        for p in (False, True)
    ]
    dot_variants += [  # the one-tile configs that `dot_prefetch` tunes over, with SiLU*up (down_proj), for
        # steps of up to 16 and of 17-32 rows
        (cfg, dict(SILU_MUL=True, NORM=False, HAS_RES=False, USE_PDL=True, PREFETCH_W=True, BLOCK_X=bx))
        for cfg in kd._DOT_ROWS_ONE_TILE_CONFIGS[: None if full else 1]
        for bx in (16, 32)
    ]
    dot_variants.append(  # the timeline trace (`DotTrace`: the GPU's global timer and SM id)
        (kd._DOT_ROWS_CONFIGS[0], dict(SILU_MUL=False, NORM=False, HAS_RES=False, USE_PDL=True, PREFETCH_W=True,
                                       TRACE=True))
    )  # fmt: skip
    dot_variants += [  # the split merge unrolled (`unroll_merge`, what the engine runs): 12 splits with SiLU*up, 8 with the norm
        (kd._DOT_ROWS_ONE_TILE_CONFIGS[6], dict(SILU_MUL=True, NORM=False, HAS_RES=False, USE_PDL=True,
                                                PREFETCH_W=True, UNROLL_MERGE=True)),
        (kd._DOT_ROWS_ONE_TILE_CONFIGS[0], dict(SILU_MUL=False, NORM=True, HAS_RES=True, USE_PDL=True,
                                                PREFETCH_W=True, UNROLL_MERGE=True)),
    ]  # fmt: skip
    for cfg, variant in dot_variants:
        build(
            kd._dot_rows_kernel,
            dict(X="*bf16", W="*bf16", Bias="*bf16", Y="*bf16", Part="*fp32", SS="*fp32", Tickets="*i32",
                 R="*bf16", R_out="*bf16", NW="*bf16", Trace="*i64"),
            dict(M="i32", N="i32", K="i32", stride_x="i32", stride_wn="i32", eps="fp32", trace_at="i32"),
            dict(HAS_BIAS=True, DOT_F32=False, **{"BLOCK_X": 16, "TRACE": False, "UNROLL_MERGE": False, **variant},
                 **cfg.kwargs),
            cfg.num_warps,
            cfg.num_stages,
        )  # fmt: skip
    for pdl, gather in ((False, False), (True, False), (True, True)):
        build(
            ke._rmsnorm_kernel,
            dict(X="*bf16", Residual="*bf16", W="*bf16", Out="*bf16", Rows="*i64"),
            dict(stride_x="i32", stride_r="i32", stride_o="i32", n_cols="i32", eps="fp32"),
            dict(HAS_RESIDUAL=True, BLOCK=1024, USE_PDL=pdl, GATHER=gather),
        )
    for pdl in (False, True):
        build(ke._silu_and_mul_kernel, dict(X="*bf16", Out="*bf16"),
              dict(stride_x="i32", stride_o="i32", n_cols="i32"), dict(BLOCK=4096, USE_PDL=pdl))  # fmt: skip
        build(
            ke._qk_norm_rope_store_kernel,
            dict(
                QKV="*bf16",
                Q_out="*bf16",
                K_buf="*bf16",
                V_buf="*bf16",
                out_cache_loc="*i64",
                positions="*i64",
                cos_sin="*fp32",
                QW="*bf16",
                KW="*bf16",
            ),  # fmt: skip
            {
                **{f"stride_{n}": "i32" for n in ("qkv", "qo_t", "qo_h", "kt", "kh", "vt", "vh", "cs")},
                "eps": "fp32",
            },
            dict(NUM_Q_HEADS=32, NUM_KV_HEADS=8, HEAD_DIM=128, BLOCK_H=32, HAS_NORM=True, USE_PDL=pdl),
        )
    build(
        ke._store_kv_kernel,
        dict(K="*bf16", V="*bf16", K_buf="*bf16", V_buf="*bf16", loc_ptr="*i64"),
        dict(stride_k="i32", stride_v="i32", stride_kb="i32", stride_vb="i32"),
        dict(ROW=1024, BLOCK=1024),
    )
    return done


def compiled(*args: str) -> list[str]:
    """This file run as a script in a fresh process (no interpreter mode) with `args`: its lines. No time
    limit (pytest's is off for the tests that call it): Triton's compiles only take longer on a busy machine."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[2])  # this checkout's package, installed or not
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.splitlines()


@pytest.mark.timeout(0)
def test_few_row_gemv_keeps_rows_in_registers_on_sm90():
    """No layout conversion or barrier in `_gemv_few_kernel`'s K loop (see `few_row_loop_conversions`)."""
    lines = compiled("few-row-loop")
    assert len(lines) == 3 * 2 and all(line.endswith(": 0") for line in lines), lines


@pytest.mark.timeout(0)
def test_kernels_compile_for_sm90():
    """Each kernel in each code path, one tile shape each."""
    lines = compiled()
    # attention 5, merge 3, gemv 2 + PDL, few-row 2 + PDL, dot 3 + 2 with PDL + 2 one-tile + trace + 2
    # unrolled, rmsnorm 3, silu and qk-norm 2 each, store 1
    assert len(lines) == 5 + 3 + 3 + 3 + 10 + 3 + 4 + 1, "\n".join(lines)
    kernels = {line.split()[0] for line in lines}
    assert len(kernels) == 9, kernels  # every kernel of the GPU path


@pytest.mark.gpu
@pytest.mark.timeout(0)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the CPU compiles each path once)")
def test_every_tile_config_compiles_for_sm90():
    lines = compiled("full")
    from tokenrouter.runtime.engine.kernels import dot_rows as kd
    from tokenrouter.runtime.engine.kernels import linear as kl

    gemvs = 2 * len(kl._GEMV_CONFIGS) + 1
    assert gemvs == 2 * 14 + 1
    few = 2 * sum(len(c) for c in kl._GEMV_FEW_CONFIGS.values()) + 1
    assert sorted(kl._GEMV_FEW_CONFIGS) == [2, 4, 8] and few == 2 * 18 + 1
    # + the traced one and the two with the merge unrolled
    dots = 3 * len(kd._DOT_ROWS_CONFIGS) + 2 + 2 * len(kd._DOT_ROWS_ONE_TILE_CONFIGS) + 1 + 2
    assert len(lines) == 16 + 3 + gemvs + few + dots + 3 + 2 * 2 + 1, "\n".join(lines)  # every one above


def few_row_loop_conversions() -> list[str]:
    """`_gemv_few_kernel` compiled for sm_90 as a launch specialises it (pointers and the multiple-of-16
    ints marked divisible by 16): per BLOCK_M and variant, the layout conversions and barriers inside its K
    loop (TTGIR). The kernel keeps every row in each thread's registers, so there should be none; with its
    tiles loaded as 3-D [rows, K/8, 8], Triton 3.6 spread the threads over the rows and converted layouts
    through shared memory for every row of every K tile (the H200's slow few-row steps)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tokenrouter.runtime.engine.kernels import linear as kl

    fn = kl._gemv_few_kernel
    ptrs = dict(X="*bf16", W="*bf16", Bias="*bf16", Y="*bf16", R="*bf16", R_out="*bf16", NW="*bf16")
    scalars = dict(M="i32", N="i32", K="i32", stride_x="i32", stride_wn="i32", eps="fp32")
    divisible = [*ptrs, "N", "K", "stride_x", "stride_wn"]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    out = []
    for bm, cfgs in kl._GEMV_FEW_CONFIGS.items():
        cfg = cfgs[0]
        for variant in (
            dict(SILU_MUL=True, NORM=False, HAS_RES=False),
            dict(SILU_MUL=False, NORM=True, HAS_RES=True),
        ):
            consts = dict(HAS_BIAS=False, BLOCK_M=bm, USE_PDL=False, **variant, **cfg.kwargs)
            src = ASTSource(fn=fn, signature={**ptrs, **scalars, **dict.fromkeys(consts, "constexpr")},
                            constexprs=consts, attrs=attrs)  # fmt: skip
            ir = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps,
                                "num_stages": cfg.num_stages}).asm["ttgir"]  # fmt: skip
            lines = ir.splitlines()
            start = next(i for i, line in enumerate(lines) if "scf.for" in line)
            depth, body = 0, []
            for line in lines[start:]:
                body.append(line)
                depth += line.count("{") - line.count("}")
                if depth <= 0 and len(body) > 1:
                    break
            bad = sum(("ttg.convert_layout" in x) or ("barrier" in x) or ("local_alloc" in x) for x in body)
            out.append(f"BLOCK_M={bm} {variant} {cfg}: {bad}")
    return out


if __name__ == "__main__":
    for line in (
        few_row_loop_conversions()
        if sys.argv[1:] == ["few-row-loop"]
        else compile_all(sys.argv[1:] == ["full"])
    ):
        print(line)
