"""The paged-attention kernel at decode, alone, over its launch options (issue 3's last decode misses: the
0.6B at bs 1, ctx 4096, 1.04-1.06 ms against the 1.0 ms target; the 8B at ctx 4096, 1.23-1.26x the floor).

A model's decode step runs the attention once per layer, each layer on its own K/V. So each case captures
one CUDA graph that calls `paged_attention` once per layer (`--layers`, default the shape's own: 28 for the
0.6B, 36 for the 8B) on that many distinct K/V buffers (no layer's KV is in L2 from the one before), as the
engine launches it (fused split merge with tickets, PDL and prefetch as the engine's defaults), and reports
microseconds per layer and the KV bytes read per second. Each option set's output is checked against the
engine's default launch (same inputs). Options: KV splits per row block (the engine's choice:
`choose_num_splits`: 32 at bs 1 with 8 KV heads on 132 SMs), KV tokens per tile (`block_n`, default 64), warps, pipeline stages.

    python bench/decode_attention_sweep.py [--shapes 0.6b,8b] [--ctx 512,4096] [--bs 1] [--budget-s 150]
    TRITON_INTERPRET=1 python bench/decode_attention_sweep.py --smoke      # CPU: the checks only, tiny
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.graph_timing import capture, replay_us  # noqa: E402
from tokenrouter.runtime.engine.attention import triton_kernels as tk  # noqa: E402

SHAPES = {  # q heads, kv heads, head_dim, layers
    "0.6b": (16, 8, 128, 28),
    "8b": (32, 8, 128, 36),
    "32b": (64, 8, 128, 64),
    "tiny": (4, 2, 16, 2),
}


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


class Case:
    """One (shape, bs, ctx) decode: `layers` K/V buffers, a page table with scattered slots, q per layer."""

    def __init__(self, shape: str, bs: int, ctx: int, layers: int, device, dtype) -> None:
        heads, kv_heads, dim, default_layers = SHAPES[shape]
        self.layers = layers or default_layers
        self.heads, self.kv_heads, self.dim, self.bs, self.ctx = heads, kv_heads, dim, bs, ctx
        slots = bs * ctx + 1
        g = torch.Generator(device="cpu").manual_seed(0)
        self.k = [
            torch.randn(slots, kv_heads, dim, generator=g).to(device, dtype) for _ in range(self.layers)
        ]
        self.v = [
            torch.randn(slots, kv_heads, dim, generator=g).to(device, dtype) for _ in range(self.layers)
        ]
        self.q = [torch.randn(bs, heads, dim, generator=g).to(device, dtype) for _ in range(self.layers)]
        self.out = [torch.empty_like(q) for q in self.q]
        table = torch.zeros(bs + 1, ctx, dtype=torch.int32)
        table[1:] = (torch.randperm(slots - 1, generator=g).view(bs, ctx) + 1).to(torch.int32)
        self.table = table.to(device)
        self.req = torch.arange(1, bs + 1, device=device)
        self.seq = torch.full((bs,), ctx, device=device)
        self.starts = torch.arange(bs, device=device)
        self.ext = torch.ones(bs, dtype=torch.long, device=device)
        self.tickets = torch.zeros(tk.attention_tickets(bs, kv_heads, 1, heads // kv_heads), dtype=torch.int32,
                                   device=device)  # fmt: skip
        self.kv_bytes = 2 * bs * ctx * kv_heads * dim * self.k[0].element_size()

    def run(self, **opts) -> None:
        for i in range(self.layers):
            tk.paged_attention(
                self.q[i], self.k[i], self.v[i], self.out[i], self.table, self.req, self.seq, self.starts,
                self.ext, 1, self.dim**-0.5, tickets=self.tickets, **opts,
            )  # fmt: skip


def time_graph(case: Case, opts: dict, reps: int) -> float:
    """Microseconds per layer: one graph of every layer's call, replayed `reps` times (median of 5)."""
    graph = capture(lambda: case.run(**opts))
    torch.cuda.synchronize()
    return statistics.median(
        replay_us(graph, reps, warmup=3 if i == 0 else 0) / case.layers for i in range(5)
    )


def check(case: Case, opts: dict, ref: list[torch.Tensor]) -> float:
    """Largest |out - ref| over every layer's output, with `opts` against the default launch."""
    case.run(**opts)
    return max((o.float() - r.float()).abs().max().item() for o, r in zip(case.out, ref, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="0.6b,8b")
    ap.add_argument("--ctx", type=ints, default=[512, 4096])
    ap.add_argument("--bs", type=ints, default=[1])
    ap.add_argument("--layers", type=int, default=0, help="layers per graph (0: the shape's own)")
    ap.add_argument("--splits", type=ints, default=[0, 8, 16, 32, 64, 128], help="0: the engine's choice")
    ap.add_argument("--block-n", type=ints, default=[32, 64, 128])
    ap.add_argument("--warps", type=ints, default=[2, 4, 8])
    ap.add_argument("--stages", type=ints, default=[1])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=150.0, help="option sets past this are skipped")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1: the checks only")
    args = ap.parse_args()

    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("--smoke needs TRITON_INTERPRET=1")
        device, dtype, shapes, args.ctx = torch.device("cpu"), torch.float32, ["tiny"], [96]
    else:
        if not torch.cuda.is_available():
            sys.exit("decode_attention_sweep needs CUDA (or --smoke with TRITON_INTERPRET=1)")
        device, dtype, shapes = torch.device("cuda"), torch.bfloat16, args.shapes.split(",")
    pdl = device.type == "cuda"
    rows_out = []
    started = time.perf_counter()
    print("| shape | bs | ctx | splits | block_n | warps | stages | us / layer | KV GB/s | max diff |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for shape, bs, ctx in itertools.product(shapes, args.bs, args.ctx):
        case = Case(shape, bs, ctx, 2 if args.smoke else args.layers, device, dtype)
        base = dict(pdl=pdl, prefetch=pdl)
        case.run(**base)
        ref = [o.clone() for o in case.out]
        default_splits = tk.choose_num_splits(bs, case.kv_heads, 1, device)
        for splits, block_n, warps, stages in itertools.product(
            args.splits, args.block_n, args.warps, args.stages
        ):
            if time.perf_counter() - started > args.budget_s:
                print(f"| {shape} | {bs} | {ctx} | (past --budget-s {args.budget_s:g}: rest skipped) |")
                break
            opts = dict(base, num_splits=splits or None, block_n=block_n, num_warps=warps, num_stages=stages)
            try:
                diff = check(case, opts, ref)
                us = float("nan") if args.smoke else time_graph(case, opts, args.reps)
            except Exception as e:  # a launch the GPU refuses (resources): say so, go on
                print(f"| {shape} | {bs} | {ctx} | {splits or default_splits} | {block_n} | {warps} | {stages} | "
                      f"failed: {type(e).__name__}: {str(e)[:80]} |")  # fmt: skip
                continue
            gbs = case.kv_bytes / (us * 1e-6) / 1e9 if us == us else float("nan")
            row = dict(shape=shape, bs=bs, ctx=ctx, splits=splits or default_splits, default_splits=not splits,
                       block_n=block_n, warps=warps, stages=stages, us_per_layer=us, kv_gbs=gbs, max_diff=diff)  # fmt: skip
            rows_out.append(row)
            print(f"| {shape} | {bs} | {ctx} | {row['splits']}{'*' if not splits else ''} | {block_n} | {warps} | "
                  f"{stages} | {us:.2f} | {gbs:.0f} | {diff:.2e} |", flush=True)  # fmt: skip
            if diff > (1e-4 if dtype == torch.float32 else 3e-2):
                sys.exit(
                    f"{shape} bs {bs} ctx {ctx} {opts}: output differs from the default launch by {diff}"
                )
        best = min((r for r in rows_out if (r["shape"], r["bs"], r["ctx"]) == (shape, bs, ctx)),
                   key=lambda r: r["us_per_layer"], default=None)  # fmt: skip
        dflt = [r for r in rows_out if (r["shape"], r["bs"], r["ctx"]) == (shape, bs, ctx) and r["default_splits"]
                and r["block_n"] == 64 and r["warps"] == 4 and r["stages"] == 1]  # fmt: skip
        if best and dflt and not args.smoke:
            print(f"\n{shape} bs {bs} ctx {ctx}: engine default {dflt[0]['us_per_layer']:.2f} us / layer; best "
                  f"{best['us_per_layer']:.2f} (splits {best['splits']}, block_n {best['block_n']}, warps "
                  f"{best['warps']}, stages {best['stages']}); x {case.layers} layers: "
                  f"{(dflt[0]['us_per_layer'] - best['us_per_layer']) * case.layers / 1e3:.3f} ms per step\n")  # fmt: skip
        del case
    if args.json:
        Path(args.json).write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()
