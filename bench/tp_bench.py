"""Decode step of one model tensor-parallel over several GPUs (`gpus: [a, b]`), against the same model on one GPU
and against the per-GPU weight-read floor (each GPU reads its 1/tp share of the weights once per step: that
share's bytes / the GPU's copy bandwidth, measured in the same run, read + write counted).

A step is `engine.forward` of `bs` held requests with one new token each, as a subserver's scheduler calls it:
rank 0's broadcast of the step to the other ranks, the model (CUDA graphs on GPU, with their all-reduces) and
the logits' all-gather included. Random weights in bf16 (the engine's dummy load) of a `make-model` shape;
`--tp` lists the group sizes to time (1: the first of `--gpus` alone), one after the other in this process.

    python3 bench/tp_bench.py --shape qwen3-32b --gpus 0,1 --tp 1,2 --decode-bs 1,4,16,64 --json out/tp32b.json
    python3 bench/tp_bench.py --shape tiny --device cpu --gpus 0,1 --decode-bs 1,2   # gloo ranks on the CPU

Prints a markdown table; `--json` writes the rows.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from tokenrouter.runtime.engine.base import StepInput
from tokenrouter.runtime.engine.embedded import load_engine
from tokenrouter.runtime.engine.make_model import make_model, shape_for
from tokenrouter.runtime.subserver.tp_worker import load_tp_engine


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def copy_bandwidth(device: torch.device, gib: float = 2.0) -> float | None:
    """Bytes per second of a device-to-device copy, read + write counted (None on the CPU)."""
    if device.type != "cuda":
        return None
    from engine_bench import measure_copy_bandwidth  # a sibling script; imports Triton, so only on a GPU

    return measure_copy_bandwidth(device, gib)


def load(folder: Path, tp: int, args) -> object:
    gpus = ints(args.gpus)
    cpu = args.device == "cpu"
    devices = ["cpu"] * tp if cpu else [f"cuda:{g}" for g in gpus[:tp]]
    rows = max(ints(args.decode_bs))
    kw = dict(
        load="dummy", max_batch=rows, graph_rows=rows, max_tokens=rows * (args.ctx + args.steps * 8 + 64) + 64
    )
    if not cpu:
        kw["dtype"] = "bfloat16"
    if tp == 1:
        return load_engine(folder, device=devices[0], **kw)
    return load_tp_engine(str(folder), devices, **kw)


def time_decode(engine, bs: int, steps: int, sync) -> float:
    """Seconds per decode step of `bs` held requests (the median of 3 runs of `steps` steps)."""
    rids = [f"r{i}" for i in range(bs)]

    def step() -> None:
        engine.forward([StepInput(r, [7]) for r in rids])

    for _ in range(3):
        step()
    runs = []
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        runs.append((time.perf_counter() - t0) / steps)
    return statistics.median(runs)


def bench(args) -> list[dict]:
    gpus = ints(args.gpus)
    sizes = ints(args.tp) if args.tp else sorted({1, len(gpus)})
    if max(sizes) > len(gpus):
        sys.exit(f"error: --tp {max(sizes)} needs that many --gpus, got {len(gpus)}")
    device = torch.device("cpu" if args.device == "cpu" else f"cuda:{gpus[0]}")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    bandwidth = copy_bandwidth(device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_model(Path(tmp) / args.shape, shape_for(args.shape), weights=False)
        for tp in sizes:
            engine = load(folder, tp, args)
            try:
                prompt = [(5 * i + 1) % 500 for i in range(args.ctx)]
                for i in range(max(ints(args.decode_bs))):  # every request's context, prefilled once
                    engine.forward([StepInput(f"r{i}", prompt)])
                per_gpu = sum(p.numel() * p.element_size() for p in engine.model.parameters())
                floor_ms = per_gpu / bandwidth * 1e3 if bandwidth else None
                for bs in ints(args.decode_bs):
                    ms = time_decode(engine, bs, args.steps, sync) * 1e3
                    rows.append(dict(shape=args.shape, tp=tp, bs=bs, ctx=args.ctx, step_ms=ms,
                                     weights_per_gpu_gb=per_gpu / 1e9, floor_ms=floor_ms))  # fmt: skip
            finally:
                close = getattr(engine, "close_group", None)
                if close is not None:
                    close()
                del engine
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def report(rows: list[dict]) -> None:
    one = {r["bs"]: r["step_ms"] for r in rows if r["tp"] == 1}
    print(
        "| tp | bs | weights per GPU (GB) | decode step (ms) | per-GPU floor (ms) | step / floor | TP=1 / this |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        floor = f"{r['floor_ms']:.3f}" if r["floor_ms"] else "n/a"
        ratio = f"{r['step_ms'] / r['floor_ms']:.2f}" if r["floor_ms"] else "n/a"
        speedup = f"{one[r['bs']] / r['step_ms']:.2f}" if r["bs"] in one else "n/a"
        print(f"| {r['tp']} | {r['bs']} | {r['weights_per_gpu_gb']:.2f} | {r['step_ms']:.3f} | {floor} | {ratio} | "
              f"{speedup} |")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen3-32b", help="a make-model shape (default qwen3-32b)")
    p.add_argument("--gpus", default="0,1", help="the GPUs of the group, in rank order (default 0,1)")
    p.add_argument("--tp", default="", help="group sizes to time, e.g. 1,2 (default: 1 and len(--gpus))")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo ranks on the CPU")
    p.add_argument("--decode-bs", default="1,4,16,64", help="decode batch sizes (default 1,4,16,64)")
    p.add_argument("--ctx", type=int, default=512, help="context tokens of every request (default 512)")
    p.add_argument("--steps", type=int, default=20, help="decode steps per timed run (default 20)")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no CUDA device here (--device cpu runs the ranks on the CPU)")
    rows = bench(args)
    report(rows)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
