"""The few-row GEMV (`gemv_rows`) on one GPU: its error against float32 and cuBLAS, and its speed, per call and per step.

Part 1, the kernel alone: the Qwen3-0.6B and -8B linear layers (bf16, random weights) with the input
variant each has in the fused forward (qkv: norm / norm + residual, o: plain, gate_up: norm + residual,
down: SiLU*up), M = 2..8 rows, `pdl` on/off. Its input is written by a PDL rmsnorm launched right before
it (as in the model, where a PDL kernel precedes every GEMV). Per case: max |diff| against a float32
torch reference and against the engine's cuBLAS path (bf16 `F.linear` after `rmsnorm` / `silu_and_mul`),
cuBLAS's own error as the rounding yardstick, and the time per call after an explicit autotune warm-up
next to cuBLAS's, both timed as a CUDA graph of back-to-back calls cycling through weight copies larger
than L2 (so weights come from HBM, as in a real step). Then, at M 2/4/8, every tile config of the kernel
timed alone, to tell a bad autotune pick from a slow kernel.

Part 2, the model: a random-weight Qwen3-0.6B (`--layers`) on the Triton backend, one request with a
fixed context, extend steps of q = 2..8 tokens (and a decode) with gemv_rows on (gemv_rows_batch_max 1)
and off, eager and in CUDA graphs, `pdl` on/off. Every step writes only its own new positions and reads
nothing another step wrote, so every run sees the same KV and the logits of two runs are comparable:
max |diff| / max |logit| against the same mode with gemv_rows off, and against the same model in float32
(the yardstick: gemv_rows on should be as close to it as off is); step times of the graphs (gemv_rows
on / off, and a decode step).

    PYTHONPATH=$PWD python3 bench/gemv_rows_check.py --json out/gemv_rows_check.json
    PYTHONPATH=$PWD python3 bench/gemv_rows_check.py --interpret   # small, on CPU (TRITON_INTERPRET=1)

Markdown on stdout, ending with the mismatches counted by switch; JSON with --json. Without CUDA (and
without --interpret) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from collections import Counter
from pathlib import Path

# (linear, input variant): every variant, each on the layer the fused forward uses it for
CASES = (("qkv", "norm"), ("qkv", "norm+res"), ("o", "plain"), ("gate_up", "norm+res"), ("down", "silu_mul"))
EPS = 1e-6
HBM_BYTES = 256 << 20  # weight copies cycled per timing: well past the H200's 50 MB L2


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--interpret", action="store_true", help="a small version on CPU under TRITON_INTERPRET=1")
    p.add_argument("--shapes", default="qwen3-0.6b,qwen3-8b", help="kernel shapes (make_model.SHAPES names)")
    p.add_argument("--rows", default="2,3,4,5,6,7,8", help="M values (rows / new tokens)")
    p.add_argument("--layers", type=int, default=28, help="decoder layers of the model check (0: skip it)")
    p.add_argument("--ctx", type=int, default=512, help="context tokens before the model check's steps")
    p.add_argument("--no-configs", action="store_true", help="skip timing every tile config")
    p.add_argument("--quick", action="store_true", help="M 2, 3, 4, 8 only and the kernels with pdl on only")
    p.add_argument("--tune-ms", type=int, default=20, help="autotune benchmark time per config (ms)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    args.rows = [int(x) for x in args.rows.split(",") if x]
    args.shapes = [s for s in args.shapes.split(",") if s]
    if args.quick:
        args.rows = [m for m in args.rows if m in (2, 3, 4, 8)]
    if args.interpret:  # small enough for the interpreter (the tiny shape; rows 2, 3, 8 unless given)
        args.shapes, args.layers, args.ctx = ["tiny"], min(args.layers, 2), 16
        if "--rows" not in (argv if argv is not None else sys.argv[1:]):
            args.rows = [2, 3, 8]
    return args


def linear_dims(shape: dict) -> dict[str, tuple[int, int]]:
    """linear -> (N, K) of a make_model shape."""
    h, i, d = shape["hidden"], shape["intermediate"], shape["head_dim"]
    return {
        "qkv": ((shape["heads"] + 2 * shape["kv_heads"]) * d, h),
        "o": (h, shape["heads"] * d),
        "gate_up": (2 * i, h),
        "down": (h, i),
    }


VARIANT_FLAGS = {  # variant -> (SILU_MUL, NORM, HAS_RES)
    "plain": (False, False, False),
    "silu_mul": (True, False, False),
    "norm": (False, True, False),
    "norm+res": (False, True, True),
}


def compile_job(job: tuple) -> None:
    """Compile one GEMV kernel variant into Triton's disk cache, with the specialisation of the real launches
    (bf16 pointers aligned to 16, M 2-8, the other ints multiples of 16): a worker of `precompile`."""
    import torch

    from tokenrouter.runtime.engine.attention import triton_kernels as tk

    kernel, consts, cfg, pdl = job
    jit = {"few": tk._gemv_few_kernel, "one": tk._gemv_kernel}[kernel]
    ptrs = [torch.empty(16, dtype=torch.bfloat16, device="cuda") for _ in range(7)]  # X W Bias Y R R_out NW
    ints = (
        [4096, 4096, 4096] if kernel == "one" else [3, 4096, 4096, 4096, 4096]
    )  # (M,) N, K, (stride_x,) stride_wn
    jit.warmup(*ptrs, *ints, 1e-6, grid=(1,), **consts, **cfg.all_kwargs(), **tk._pdl(pdl, ptrs[0].device))


class Check:
    def __init__(self, args) -> None:
        import torch
        import torch.nn.functional as F

        from tokenrouter.runtime.engine.attention import triton_kernels as tk

        self.args, self.torch, self.F, self.tk = args, torch, F, tk
        self.gpu = not args.interpret
        self.dev = torch.device("cuda" if self.gpu else "cpu")
        self.gen = torch.Generator(device=self.dev).manual_seed(0)
        self.results: dict = {"kernel": [], "configs": [], "model": []}

    def randn(self, *shape, scale=1.0):
        t = self.torch.randn(*shape, generator=self.gen, device=self.dev, dtype=self.torch.float32)
        return (t * scale).to(self.torch.bfloat16)

    # ---- timing ----------------------------------------------------------------------------------------
    def per_call_us(self, call, copies: int) -> float:
        """Microseconds per call: a CUDA graph of back-to-back calls, call(i) using weight copy i."""
        from bench.graph_timing import capture, replay_us

        n = max(24, 2 * copies)
        return replay_us(capture(lambda: [call(i % copies) for i in range(n)]), 5, warmup=1) / n

    def precompile(self) -> None:
        """Every few-row (and, for the model's decode steps, one-row) GEMV variant this run autotunes, compiled
        in parallel processes into Triton's disk cache, where the autotuner then finds them (serially they
        take minutes). Best effort: on any failure the autotuner compiles them itself."""
        if not self.gpu:
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        tk = self.tk
        model = self.args.layers > 0  # its steps run every variant with pdl on and off, and decodes (one row)
        pdls = (True,) if self.args.quick and not model else (True, False)
        bms = sorted({max(2, 1 << (m - 1).bit_length()) for m in self.args.rows})
        jobs = []
        for silu, norm, res in VARIANT_FLAGS.values():
            for pdl in pdls:
                consts = dict(HAS_BIAS=False, SILU_MUL=silu, NORM=norm, HAS_RES=res)  # + `_pdl`'s in the job
                jobs += [
                    ("few", {**consts, "BLOCK_M": bm}, c, pdl) for bm in bms for c in tk._GEMV_FEW_CONFIGS[bm]
                ]
                if model:
                    jobs += [("one", consts, c, pdl) for c in tk._GEMV_CONFIGS]
        t0 = time.perf_counter()
        try:
            workers = max(1, min(16, (os.cpu_count() or 2) - 1))
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                list(pool.map(compile_job, jobs, chunksize=4))
            note = f"{len(jobs)} GEMV variants compiled in {time.perf_counter() - t0:.0f} s ({workers} processes)"
        except Exception as e:  # noqa: BLE001 — only a speed-up: the autotuner compiles what is missing
            note = f"parallel compile failed ({type(e).__name__}: {e}); the autotuner compiles serially"
        self.results["precompile"] = note
        print(f"<!-- {note} -->", file=sys.stderr, flush=True)

    def quick_tuning(self) -> None:
        """Autotune each config for --tune-ms (the engine's default is 100 ms) to keep the run short."""
        if not self.gpu:
            return
        import triton.testing

        ms = self.args.tune_ms

        def bench(fn, quantiles=None):
            return triton.testing.do_bench(fn, warmup=max(1, ms // 4), rep=ms, quantiles=quantiles)

        tk = self.tk
        for tuner in (*tk._gemv_few.values(), tk._gemv, tk._gemv_base):
            tuner._do_bench = bench
            tuner.__dict__["do_bench"] = bench  # over a cached_property or a plain attribute

    # ---- part 1: the kernel ----------------------------------------------------------------------------
    def kernel_case(self, shape_name: str, linear: str, variant: str, n: int, k: int, m: int, w) -> None:
        torch, F, tk = self.torch, self.F, self.tk
        silu, norm, res = variant == "silu_mul", variant.startswith("norm"), variant == "norm+res"
        src = self.randn(m, 2 * k if silu else k)
        ones = torch.ones(src.shape[1], device=self.dev, dtype=torch.bfloat16)
        nw = (1.0 + self.randn(k, scale=0.1).float()).to(torch.bfloat16) if norm else None
        r = self.randn(m, k) if res else None
        # the reference input: the (deterministic) rmsnorm the checked call gets from a PDL launch
        x_ref = tk.rmsnorm(src, ones, EPS)
        a = x_ref.float()
        if silu:
            a = (F.silu(a[:, :k]) * a[:, k:]).to(torch.bfloat16).float()
        if norm:
            h = (a + r.float()).to(torch.bfloat16).float() if res else a
            a = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * nw.float()
        ref = a @ w[0].float().T
        if silu:  # the engine's cuBLAS path for the same layer
            cub = F.linear(tk.silu_and_mul(x_ref), w[0])
        elif norm:
            cub = F.linear(tk.rmsnorm(x_ref, nw, EPS, residual=r.clone() if res else None), w[0])
        else:
            cub = F.linear(x_ref, w[0])
        scale = ref.abs().max().item()
        cub_err = (cub.float() - ref).abs().max().item()
        copies = len(w)
        cub_in = tk.silu_and_mul(x_ref) if silu else tk.rmsnorm(x_ref, nw, EPS) if norm else x_ref
        cub_us = self.per_call_us(lambda i: F.linear(cub_in, w[i]), copies) if self.gpu else None
        for pdl in (True,) if self.args.quick else (True, False):
            r_out = torch.empty_like(r) if res else None
            extra = dict(silu_mul=silu, norm_weight=nw, eps=EPS, residual=r, residual_out=r_out)

            def call(i, x=x_ref, extra=extra, pdl=pdl):
                return tk.gemv_rows(x, w[i], None, pdl=pdl, **extra)

            t0 = time.perf_counter()
            call(0)  # the autotune warm-up (first use of this key)
            if self.gpu:
                self.torch.cuda.synchronize()
            tune_s = time.perf_counter() - t0
            tuner = tk._gemv_few[max(2, 1 << (m - 1).bit_length())]
            picked = str(getattr(tuner, "best_config", "fixed (interpreter)"))
            # the checked call: its input written by a PDL rmsnorm just before it
            x = tk.rmsnorm(src, ones, EPS, pdl=pdl)
            y = tk.gemv_rows(x, w[0], None, pdl=pdl, **extra).float()
            err = (y - ref).abs().max().item()
            row = dict(shape=shape_name, linear=linear, variant=variant, N=n, K=k, M=m, pdl=pdl,
                       max_ref=scale, err_fp32=err, cublas_err_fp32=cub_err,
                       diff_cublas=(y - cub.float()).abs().max().item(), config=picked, tune_s=tune_s)  # fmt: skip
            if res:
                h_ref = (x_ref.float() + r.float()).to(torch.bfloat16)
                # in units of one bf16 step at the stream's largest value (the interpreter truncates)
                ulp = h_ref.float().abs().max().item() / 128
                row["residual_out_err"] = (r_out.float() - h_ref.float()).abs().max().item() / ulp
            row["ok"] = err <= 2 * cub_err + scale / 128 and row.get("residual_out_err", 0.0) <= 1.0
            if self.gpu:
                row["us"] = self.per_call_us(call, copies)
                row["cublas_us"] = cub_us
            self.results["kernel"].append(row)
            if self.gpu and pdl and not self.args.no_configs and m in (2, 4, 8):
                self.time_configs(tuner, call, copies, row)

    def time_configs(self, tuner, call, copies: int, row: dict) -> None:
        """Every tile config of the kernel `call` runs, alone (the autotuner held to one config)."""
        saved = tuner.configs
        try:
            for cfg in saved:
                tuner.configs = [cfg]
                us = self.per_call_us(call, copies)
                self.results["configs"].append(
                    {
                        **{k: row[k] for k in ("shape", "linear", "variant", "M")},
                        "config": str(cfg),
                        "us": us,
                        "picked": str(cfg) == row["config"],
                    }  # fmt: skip
                )
        finally:
            tuner.configs = saved

    def kernels(self) -> None:
        from tokenrouter.runtime.engine.make_model import SHAPES

        torch = self.torch
        for name in self.args.shapes:
            dims = linear_dims(SHAPES[name])
            for linear, variant in CASES:
                n, k = dims[linear]
                w0 = self.randn(n, k, scale=0.02)
                copies = max(2, -(-HBM_BYTES // (w0.numel() * 2))) if self.gpu else 1
                w = [w0] + [self.randn(n, k, scale=0.02) for _ in range(copies - 1)]
                for m in self.args.rows:
                    self.kernel_case(name, linear, variant, n, k, m, w)
                del w, w0
                if self.gpu:
                    torch.cuda.empty_cache()
                print(f"<!-- kernel {name} {linear} {variant}: done -->", file=sys.stderr, flush=True)

    # ---- part 2: the model -----------------------------------------------------------------------------
    def model_setup(self, dtype, weights=None) -> types.SimpleNamespace:
        """The model check's model on the Triton backend in `dtype` (the weights of `weights`, another
        setup, when given), one request holding `--ctx` tokens of fixed random K/V, and `batch(q)`: its
        step of q new tokens at positions ctx..ctx+q-1 (the same ids and slots in every setup)."""
        from tokenrouter.runtime.engine.attention import AttentionConfig
        from tokenrouter.runtime.engine.attention.triton_backend import TritonAttnBackend
        from tokenrouter.runtime.engine.config import ModelConfig
        from tokenrouter.runtime.engine.forward_batch import ForwardBatch
        from tokenrouter.runtime.engine.make_model import config_dict, shape_for
        from tokenrouter.runtime.engine.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from tokenrouter.runtime.engine.models import build_empty, init_dummy_weights

        torch, args, dev = self.torch, self.args, self.dev
        name = "tiny" if args.interpret else "qwen3-0.6b"
        c = ModelConfig.from_dict(config_dict(shape_for(name, layers=args.layers)), name)
        model = build_empty(c, dev, dtype)
        if weights is None:
            init_dummy_weights(model, seed=0)
        else:
            with torch.no_grad():
                for mine, theirs in zip(model.parameters(), weights.model.parameters(), strict=True):
                    mine.copy_(theirs)
        ctx = args.ctx
        pool = MHATokenToKVPool(ctx + 16, dtype, c.num_key_value_heads, c.head_dim, c.num_hidden_layers, dev)
        r2t = ReqToTokenPool(2, ctx + 16, dev)
        req, slots = r2t.alloc(), pool.alloc(ctx + 8)
        r2t.write(req, 0, slots)
        gen = torch.Generator(device=dev).manual_seed(2)
        for layer in range(c.num_hidden_layers):  # the context: random K/V (bf16 values), never written again
            for buf in pool.get_kv_buffer(layer):
                kv = torch.randn(ctx, *buf.shape[1:], generator=gen, device=dev).to(torch.bfloat16)
                buf[slots[:ctx].to(dev)] = kv.to(dtype)
        ids = torch.randint(0, c.vocab_size, (8,), generator=torch.Generator().manual_seed(1)).tolist()
        backend = TritonAttnBackend(AttentionConfig(c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                                    c.scaling, c.num_hidden_layers, dtype, dev))  # fmt: skip
        model.attn_backend = backend

        def batch(q: int) -> ForwardBatch:
            return ForwardBatch.build(input_ids=ids[:q], out_cache_loc=slots[ctx : ctx + q], req_pool_indices=[req],
                                      extend_prefix_lens=[ctx], extend_seq_lens=[q], device=dev,
                                      req_to_token_pool=r2t, token_to_kv_pool=pool)  # fmt: skip

        def eager(q: int):
            fb = batch(q)
            with torch.inference_mode():
                backend.init_forward_metadata(fb)
                return model(fb)[0].float()

        # what CudaGraphRunner reads of an engine
        return types.SimpleNamespace(attn_backend=backend, model=model, req_to_token_pool=r2t, token_to_kv_pool=pool,
                                     device=dev, max_batch=1, batch=batch, eager=eager)  # fmt: skip

    def model(self) -> None:
        from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner

        torch = self.torch
        qs = [q for q in self.args.rows if q >= 2]
        # bf16 as served; under the interpreter float32: its bf16 `tl.dot` (attention) is wrong (Triton 3.9)
        bf16 = self.model_setup(torch.float32 if self.args.interpret else torch.bfloat16)
        # the yardstick: the same model and context in float32 (cuBLAS path, no PDL, eager)
        f32 = self.model_setup(torch.float32, weights=bf16)
        f32.attn_backend.pdl = False
        exact = {q: f32.eager(q) for q in qs}
        del f32
        backend = bf16.attn_backend
        logits: dict[tuple, torch.Tensor] = {}
        step_ms: dict[tuple, float] = {}
        for rows_on, pdl in [(rows_on, pdl) for rows_on in (False, True) for pdl in (True, False)]:
            backend.gemv_rows, backend.gemv_rows_batch_max = rows_on, 1 if rows_on else 0
            backend.pdl = pdl
            for q in qs:
                logits[(rows_on, pdl, "eager", q)] = bf16.eager(q)
            if not self.gpu:
                continue
            runner = CudaGraphRunner(bf16, CudaGraphConfig((1,), (1,), tuple(qs)))
            for q in [1, *qs]:
                fb = bf16.batch(q)
                with torch.inference_mode():
                    logits[(rows_on, pdl, "graph", q)] = runner.replay(fb)[0].float()
                    for _ in range(3):
                        runner.replay(fb)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(20):
                        runner.replay(fb)
                    torch.cuda.synchronize()
                step_ms[(rows_on, pdl, q)] = (time.perf_counter() - t0) / 20 * 1e3
            del runner
            torch.cuda.empty_cache()

        def rel(a, b) -> float:
            return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()

        for (rows_on, pdl, mode, q), lg in logits.items():
            if not rows_on or q == 1:
                continue
            off = logits[(False, pdl, mode, q)]
            row = dict(q=q, mode=mode, pdl=pdl, diff_vs_off=rel(lg, off),
                       err_fp32=rel(lg, exact[q]), off_err_fp32=rel(off, exact[q]))  # fmt: skip
            if mode == "graph":
                row.update(ms=step_ms[(True, pdl, q)], off_ms=step_ms[(False, pdl, q)],
                           decode_ms=step_ms[(False, pdl, 1)])  # fmt: skip
            # as close to the float32 model as the cuBLAS path (bf16 rounding, amplified over the layers)
            row["ok"] = row["err_fp32"] <= 2 * row["off_err_fp32"] + 1e-3
            self.results["model"].append(row)

    # ---- report ----------------------------------------------------------------------------------------
    def report(self) -> None:
        res = self.results
        if res["kernel"]:
            print("\n## Kernel: gemv_rows against float32 torch and the cuBLAS path\n")
            print("err: max |diff| / max |fp32 reference|; ok: err within 2x cuBLAS's + 1/128 and (norm+res) the new residual stream within one bf16 step. Times: us per call "
                  "(CUDA graph, weights from HBM; cuBLAS: the linear alone, without its rmsnorm / silu_and_mul launch).\n")  # fmt: skip
            print("| shape | linear | variant | M | pdl | err | cuBLAS err | vs cuBLAS | ok | us | cuBLAS us "
                  "| x | config | tune s |")  # fmt: skip
            print("|" + " --- |" * 14)
            for r in res["kernel"]:
                s = r["max_ref"] or 1.0
                us, cu = r.get("us"), r.get("cublas_us")
                print(f"| {r['shape']} | {r['linear']} | {r['variant']} | {r['M']} | {r['pdl']} | "
                      f"{r['err_fp32'] / s:.2e} | {r['cublas_err_fp32'] / s:.2e} | {r['diff_cublas'] / s:.2e} | "
                      f"{'ok' if r['ok'] else '**WRONG**'} | {_f(us)} | {_f(cu)} | "
                      f"{_f(us / cu if us and cu else None, 2)} | {r['config']} | {r['tune_s']:.1f} |")  # fmt: skip
        if res["configs"]:
            print("\n## Every tile config alone (pdl on): us per call; * the autotuner's pick\n")
            groups: dict[tuple, list] = {}
            for r in res["configs"]:
                groups.setdefault((r["shape"], r["linear"], r["variant"], r["M"]), []).append(r)
            print("| shape | linear | variant | M | configs (us) |")
            print("| --- | --- | --- | --- | --- |")
            for key, rows in groups.items():
                cells = "; ".join(
                    f"{'*' if r['picked'] else ''}{_short(r['config'])} {r['us']:.1f}" for r in rows
                )
                print("| " + " | ".join(str(v) for v in key) + f" | {cells} |")
        if res["model"]:
            print("\n## Model: extend steps, gemv_rows on against off (same KV for every run)\n")
            print("max |logit diff| / max |logit|: against the same step with gemv_rows off, and against the same "
                  "model in float32 (eager, cuBLAS, no PDL); ok: within 2x the error of gemv_rows off + 1e-3. "
                  "Step times: graph replays, wall clock (as engine_bench).\n")  # fmt: skip
            print("| q | mode | pdl | vs off | err vs fp32 | off: err vs fp32 | ok | ms | off ms "
                  "| decode ms | / decode | off / decode |")  # fmt: skip
            print("|" + " --- |" * 12)
            for r in sorted(res["model"], key=lambda r: (r["mode"], r["q"], not r["pdl"])):
                ms, off, dec = r.get("ms"), r.get("off_ms"), r.get("decode_ms")
                print(f"| {r['q']} | {r['mode']} | {r['pdl']} | {r['diff_vs_off']:.3g} | "
                      f"{r['err_fp32']:.3g} | {r['off_err_fp32']:.3g} | {'ok' if r['ok'] else '**WRONG**'} | "
                      f"{_f(ms, 3)} | {_f(off, 3)} | {_f(dec, 3)} | {_f(ms / dec if ms and dec else None, 2)} | "
                      f"{_f(off / dec if off and dec else None, 2)} |")  # fmt: skip
        print("\n## Mismatches by switch (wrong / cases)\n")
        for part, keys in (
            ("kernel", ("pdl", "M", "variant", "shape")),
            ("model", ("pdl", "mode", "q")),
        ):
            rows = res[part]
            if not rows:
                continue
            for key in keys:
                total, bad = Counter(r[key] for r in rows), Counter(r[key] for r in rows if not r["ok"])
                cells = ", ".join(f"{k}: {bad[k]}/{total[k]}" for k in total)
                print(f"- {part}, by {key}: {cells}")


def _f(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _short(cfg: str) -> str:
    return (
        cfg.replace("BLOCK_N: ", "n")
        .replace("BLOCK_K: ", "k")
        .replace("num_warps: ", "w")
        .replace("num_stages: ", "s")
        .split(", num_ctas")[0]
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels module is imported
    import torch

    if not args.interpret and not torch.cuda.is_available():
        print("gemv_rows_check: no CUDA device, nothing checked (--interpret runs a small version on CPU)")
        return 0
    check = Check(args)
    import triton

    from tokenrouter.runtime.engine.attention.triton_kernels import PDL_SUPPORTED

    device = torch.cuda.get_device_name() if check.gpu else "CPU (TRITON_INTERPRET=1)"
    print(f"# gemv_rows check: {device}, torch {torch.__version__}, triton {triton.__version__}, "
          f"PDL supported: {PDL_SUPPORTED}")  # fmt: skip
    started = time.perf_counter()
    check.precompile()
    check.quick_tuning()
    check.kernels()
    kernel_s = time.perf_counter() - started
    if args.layers > 0:
        check.model()
    check.report()
    total_s = time.perf_counter() - started
    print(f"\n{kernel_s:.0f} s for the kernels, {total_s:.0f} s in all")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(device=device, torch=torch.__version__, triton=triton.__version__, pdl_supported=PDL_SUPPORTED,
                    kernel_s=kernel_s, total_s=total_s, args={k: str(v) for k, v in vars(args).items()})  # fmt: skip
        args.json.write_text(json.dumps({"meta": meta, **check.results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
