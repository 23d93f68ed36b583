"""The tensor-core few-row linear (`dot_rows`) on one GPU, per layer: its time per call against cuBLAS
(`F.linear`) and the few-row GEMV (`gemv_rows`, M <= 8), and its error against float32, at the Qwen3-0.6B
and -8B layer shapes (bf16, random weights), M rows; then every tile config alone at the largest M, to tell
a bad autotune pick from a slow kernel. Each time is a CUDA graph of back-to-back calls cycling through
weight copies larger than L2 (so the weights come from HBM, as in a real step), by `bench.graph_timing`.

    python bench/dot_rows_check.py [--shapes qwen3-0.6b,qwen3-8b] [--rows 2,4,8,12,16] [--json FILE]
    TRITON_INTERPRET=1 python bench/dot_rows_check.py --smoke   # CPU: the error columns only, tiny shapes

Markdown on stdout; JSON with --json.
"""

# ruff: noqa: B023  (every closure below is timed within its own loop iteration)
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gemv_rows_check import linear_dims  # noqa: E402
from bench.graph_timing import capture, replay_us  # noqa: E402
from tokenrouter.runtime.engine.attention import triton_kernels as tk  # noqa: E402
from tokenrouter.runtime.engine.make_model import SHAPES  # noqa: E402

HBM_BYTES = 256 << 20  # weight bytes cycled per timing: well past the H200's 50 MB L2


def layers(shape: dict) -> dict[str, tuple[int, int, bool]]:
    """linear -> (N, K, silu_mul) of a make_model shape (down_proj takes [gate | up] and applies SiLU * up)."""
    return {name: (n, k, name == "down") for name, (n, k) in linear_dims(shape).items()}


def time_us(call, copies: int, gpu: bool) -> float:
    """Microseconds per call(i): one graph of 2 * copies calls, each on weight copy i % copies."""
    if not gpu:
        return float("nan")
    n = 2 * copies
    return replay_us(capture(lambda: [call(i % copies) for i in range(n)]), 5) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="qwen3-0.6b,qwen3-8b")
    ap.add_argument("--rows", default="2,4,8,12,16")
    ap.add_argument("--no-configs", action="store_true", help="skip timing every tile config alone")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    gpu = torch.cuda.is_available() and not a.smoke
    if not gpu and os.environ.get("TRITON_INTERPRET") != "1":
        print("dot_rows_check needs CUDA (or --smoke with TRITON_INTERPRET=1)", file=sys.stderr)
        return 0
    dev = torch.device("cuda" if gpu else "cpu")
    rows = [int(x) for x in a.rows.split(",") if x]
    shapes = {"tiny": SHAPES["tiny"]} if a.smoke else {s: SHAPES[s] for s in a.shapes.split(",") if s}
    g = torch.Generator(device=dev).manual_seed(0)
    out: dict = {"kernel": [], "configs": []}
    t0 = time.perf_counter()
    print("| shape | linear | N | K | M | cuBLAS µs | gemv_rows µs | dot_rows µs | cuBLAS / dot_rows | "
          "dot_rows err | cuBLAS err |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for sname, shape in shapes.items():
        for lname, (n, k, silu) in layers(shape).items():
            copies = max(2, min(64, HBM_BYTES // (2 * n * k))) if gpu else 1
            ws = [
                (torch.randn(n, k, generator=g, device=dev) / k**0.5).to(torch.bfloat16)
                for _ in range(copies)
            ]
            for m in rows:
                x = torch.randn(m, 2 * k if silu else k, generator=g, device=dev).to(torch.bfloat16)
                inp = (F.silu(x[:, :k].float()) * x[:, k:].float()).to(torch.bfloat16) if silu else x
                want = F.linear(inp.double(), ws[0].double())
                dot = tk.dot_rows(x, ws[0], silu_mul=silu)  # autotunes on the first call
                cub = F.linear(inp, ws[0])
                row = {"shape": sname, "linear": lname, "n": n, "k": k, "m": m,
                       "dot_err": (dot.double() - want).abs().max().item(),
                       "cublas_err": (cub.double() - want).abs().max().item(),
                       "cublas_us": time_us(lambda i: F.linear(tk.silu_and_mul(x) if silu else x, ws[i]), copies, gpu),
                       "dot_us": time_us(lambda i: tk.dot_rows(x, ws[i], silu_mul=silu), copies, gpu),
                       "gemv_rows_us": float("nan")}  # fmt: skip
                if 2 <= m <= tk.GEMV_ROWS_LIMIT:
                    tk.gemv_rows(x, ws[0], silu_mul=silu)
                    row["gemv_rows_us"] = time_us(
                        lambda i: tk.gemv_rows(x, ws[i], silu_mul=silu), copies, gpu
                    )
                out["kernel"].append(row)
                print(f"| {sname} | {lname} | {n} | {k} | {m} | {row['cublas_us']:.2f} | {row['gemv_rows_us']:.2f} "
                      f"| {row['dot_us']:.2f} | {row['cublas_us'] / row['dot_us']:.2f}x | {row['dot_err']:.2e} "
                      f"| {row['cublas_err']:.2e} |")  # fmt: skip
            if a.no_configs or not gpu:
                continue
            m = max(rows)
            x = torch.randn(m, 2 * k if silu else k, generator=g, device=dev).to(torch.bfloat16)
            for cfg in tk._DOT_ROWS_CONFIGS:
                meta = {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
                try:
                    us = time_us(
                        lambda i, meta=meta: tk.dot_rows(x, ws[i], silu_mul=silu, config=meta), copies, gpu
                    )
                except Exception as e:  # noqa: BLE001 (a config that does not compile here: say so, go on)
                    us = float("nan")
                    meta["error"] = f"{type(e).__name__}: {str(e)[:120]}"
                out["configs"].append({"shape": sname, "linear": lname, "m": m, **meta, "us": us})
    if out["configs"]:
        print("\nEvery tile config alone (µs per call; BLOCK_W, BLOCK_K, SPLIT_K, warps, stages):\n")
        print("| shape | linear | M | config | µs |")
        print("| --- | --- | ---: | --- | ---: |")
        for c in out["configs"]:
            tile = f"{c['BLOCK_W']}, {c['BLOCK_K']}, {c['SPLIT_K']}, {c['num_warps']}, {c['num_stages']}"
            print(f"| {c['shape']} | {c['linear']} | {c['m']} | {tile} | {c['us']:.2f} |")
    print(f"\n# {time.perf_counter() - t0:.0f} s")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
