"""The paged-attention kernel alone, launched as the engine launches it, at chosen steps and variants.

Each point BSxQ@CTX is one attention launch of a step: BS requests whose sequences end at CTX tokens, the
last Q of them new (Q 1: a decode). Its launch options (KV splits, pipeline stages, early reads, the fused
merge's tickets, the KV tile) are the ones `TritonAttnBackend.metadata_for` picks for that shape, so the kernel runs as in
the engine's step; a variant changes one of them, or the data:

- `stages=N`, `warps=N`, `block_n=N`, `splits=N`: a launch option;
- `zero_q`: every query row zero (a decode's padding rows are zero; tests whether the values matter);
- `permuted`: the requests' KV slots scattered token by token instead of contiguous (as engine_bench holds them).

Timing: 20 launches captured in one CUDA graph, replayed back to back; µs per launch, median of 5. No PDL (a
launch alone has no kernel before it). KV GB/s counts the K and V bytes of every request once.

    python3 bench/attn_probe.py --points 16x1@4096,16x8@4096,4x1@4096,4x8@4096 --variants zero_q,stages=3
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_bench import profile_cases  # noqa: E402

from tokenrouter.runtime.engine.attention import triton_kernels as tk  # noqa: E402
from tokenrouter.runtime.engine.attention.base import AttentionConfig  # noqa: E402
from tokenrouter.runtime.engine.attention.triton_backend import TritonAttnBackend  # noqa: E402

LAUNCH_OPTIONS = {"stages": "num_stages", "warps": "num_warps", "block_n": "block_n", "splits": "num_splits"}
DATA_VARIANTS = ("zero_q", "permuted")


SWEEP = {"block_n": (32, 64, 128), "stages": (1, 2, 3), "warps": (4, 8)}


def parse_variants(text: str) -> list[str]:
    """ "zero_q,stages=3,block_n=128+stages=3" -> ["default", ...]: a data variant, or launch options joined
    by "+" into one variant."""
    variants = ["default"]
    for item in filter(None, (x.strip() for x in text.split(","))):
        parts = [x.strip() for x in item.split("+")]
        ok = item in DATA_VARIANTS or all(
            name in LAUNCH_OPTIONS and sep and value.isdigit()
            for name, sep, value in (x.partition("=") for x in parts)
        )
        if not ok:
            known = ", ".join([*DATA_VARIANTS, *(f"{k}=N" for k in LAUNCH_OPTIONS)])
            raise SystemExit(f"--variants: {item!r} is not one of {known}, or launch options joined by +")
        variants.append("+".join(parts))
    return variants


def sweep_variants() -> list[str]:
    """Every combination of SWEEP's launch options, as variants."""
    return ["default"] + [
        f"block_n={n}+stages={s}+warps={w}"
        for n in SWEEP["block_n"]
        for s in SWEEP["stages"]
        for w in SWEEP["warps"]
    ]


def launch_options(backend: TritonAttnBackend, bs: int, q_len: int, variant: str) -> dict:
    """`paged_attention`'s launch options for one attention launch of a step of `bs` requests of `q_len` new
    tokens each, as the engine's backend chooses them (`metadata_for`), with a launch variant applied."""
    launch = dict(num_warps=4, **backend.launch_options(backend.metadata_for(bs, q_len)))
    for item in variant.split("+"):
        name, _, value = item.partition("=")
        if name in LAUNCH_OPTIONS:
            launch[LAUNCH_OPTIONS[name]] = int(value)
    if launch["num_splits"] > 1 and launch["tickets"] is None and backend.fused_merge:  # `splits=N` from 1
        launch["tickets"] = backend.tickets_for(bs, q_len)
    return launch


def time_graph(fn, launches: int = 20, reps: int = 5) -> float:
    """Microseconds per call of `fn`, `launches` calls captured in one CUDA graph (median of `reps` replays
    after warm-up)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return statistics.median(times)


def table_line(row: dict, label: str, kv_bytes: int, base_us: float | None) -> str:
    """One timed launch as a row of the printed table (`base_us`: the point's default, None if it failed)."""
    tile = row["block_n"] or "kernel's"
    against = f"{row['us'] / base_us:.3f}" if base_us else ""
    return (f"| {row['bs']}x{row['q']}@{row['ctx']} | {label} | {row['splits']} | {tile} | {row['stages']} | "
            f"{'yes' if row['prefetch'] else 'no'} | {row['us']:.2f} | {kv_bytes / row['us'] / 1e3:.0f} | {against} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=16, help="query heads (the 0.6B: 16, the 8B: 32)")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--points", type=profile_cases, default=profile_cases("16x1@4096,16x8@4096"))
    p.add_argument("--variants", type=parse_variants, default=["default"])
    p.add_argument(
        "--sweep",
        action="store_true",
        help="every combination of block_n 32/64/128, stages 1-3, warps 4/8 (instead of --variants); prints "
        "each point's best and writes every time to the JSON",
    )
    p.add_argument("--out", default="out/attn_probe")
    args = p.parse_args(argv)
    if args.sweep:
        args.variants = sweep_variants()
    if not torch.cuda.is_available():
        print("attn_probe needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    cfg = AttentionConfig(
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        scaling=args.head_dim**-0.5,
        num_layers=1,
        dtype=dtype,
        device=dev,
    )
    backend = TritonAttnBackend(cfg)
    max_bs = max(bs for bs, _, _ in args.points)
    max_ctx = max(ctx for _, _, ctx in args.points)
    slots = max_bs * max_ctx + 1  # slot 0 stays unused, as in the engine's pool
    gen = torch.Generator(device=dev).manual_seed(0)
    k_buf = torch.randn(slots, args.kv_heads, args.head_dim, device=dev, dtype=dtype, generator=gen)
    v_buf = torch.randn(slots, args.kv_heads, args.head_dim, device=dev, dtype=dtype, generator=gen)
    # request b's KV slots in row b + 1 of the table (row 0, padding's, stays zero): contiguous or scattered
    order = {
        "contiguous": torch.arange(slots - 1, device=dev),
        "permuted": torch.randperm(slots - 1, device=dev, generator=gen),
    }
    tables = {}
    for name, perm in order.items():
        tables[name] = torch.zeros(max_bs + 1, max_ctx, dtype=torch.int32, device=dev)
        tables[name][1:] = (perm.to(torch.int32) + 1).view(max_bs, max_ctx)
    print(f"## Paged attention alone on {torch.cuda.get_device_name()}: {args.heads} query heads, "
          f"{args.kv_heads} KV heads, head_dim {args.head_dim}, bf16 (µs per launch)\n")  # fmt: skip
    print("| point | variant | splits | KV tile | stages | early reads | µs | KV GB/s | vs default |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    rows = []
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for bs, q_len, ctx in args.points:
        q = torch.randn(bs * q_len, args.heads, args.head_dim, device=dev, dtype=dtype, generator=gen)
        out = torch.empty_like(q)
        req = torch.arange(1, bs + 1, device=dev)
        seq = torch.full((bs,), ctx, device=dev)
        starts = torch.arange(bs, device=dev) * q_len
        ext = torch.full((bs,), q_len, device=dev)
        kv_bytes = 2 * bs * ctx * args.kv_heads * args.head_dim * k_buf.element_size()
        base_us = None
        for variant in args.variants:
            launch = launch_options(backend, bs, q_len, variant)
            table = tables["permuted" if variant == "permuted" else "contiguous"]
            q_in = torch.zeros_like(q) if variant == "zero_q" else q
            call = functools.partial(
                tk.paged_attention, q_in, k_buf, v_buf, out, table, req, seq, starts, ext, q_len, cfg.scaling,
                **launch,
            )  # fmt: skip
            try:
                us = time_graph(call)
            except Exception as e:  # noqa: BLE001 — e.g. a tile that does not fit the SM's shared memory
                print(
                    f"| {bs}x{q_len}@{ctx} | {variant} | failed: {type(e).__name__} | | | | | | |", flush=True
                )
                continue
            base_us = us if variant == "default" else base_us
            rows.append(dict(bs=bs, q=q_len, ctx=ctx, variant=variant, us=us, splits=launch["num_splits"],
                             block_n=launch["block_n"], stages=launch["num_stages"], warps=launch["num_warps"],
                             prefetch=launch["prefetch"]))  # fmt: skip
            if not args.sweep:
                print(table_line(rows[-1], variant, kv_bytes, base_us), flush=True)
        timed = [r for r in rows if (r["bs"], r["q"], r["ctx"]) == (bs, q_len, ctx)]
        if args.sweep and timed:
            best = min(timed, key=lambda r: r["us"])
            print(table_line(best, f"best: {best['variant']}", kv_bytes, base_us), flush=True)
        # after every point: a run stopped by its time limit keeps what it measured
        (Path(args.out) / "attn_probe.json").write_text(
            json.dumps(dict(argv=sys.argv[1:], rows=rows), indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
