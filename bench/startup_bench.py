"""How long an embedded engine takes to start on the GPU, and how much of it is autotuning.

For each model shape (random bf16 weights filled on the GPU, the engine's dummy load, the default CUDA graph
shapes, as a subserver builds it), three fresh processes in a row share one Triton cache directory:
- `cold`: an empty cache directory (every kernel compiled, every linear layer's tiles timed);
- `retune`: compiled kernels on disk, autotuning results not kept (`TOKENROUTER_AUTOTUNE_CACHE=0`): every
  start before autotuning results were cached;
- `warm`: compiled kernels and autotuning results on disk (the default since then).
Each process reports its wall time (interpreter start, imports, model build, KV pools, graph capture, exit), the graph capture alone, and the autotuning it did (`TRITON_PRINT_AUTOTUNING`:
the kernels tuned and the seconds their candidates took). Prints a markdown table; writes startup_bench.json
under --out.

    python3 bench/startup_bench.py --shapes qwen3-0.6b,qwen3-8b --out out/startup
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

SCENARIOS = (  # name, TOKENROUTER_AUTOTUNE_CACHE, what it stands for
    ("cold", "1", "empty Triton cache"),
    ("retune", "0", "kernels compiled, tiles timed again (no autotune cache)"),
    ("warm", "1", "kernels compiled, tiles from the autotune cache"),
)
_TUNED = re.compile(r"finished after ([0-9.]+)s")


def child(folder: str, device: str) -> None:
    """Build the engine as a subserver does (its graph capture runs every captured shape); print the times as one
    JSON line."""
    t0 = time.perf_counter()
    import torch

    from tokenrouter.runtime.engine.embedded import load_engine

    t_import = time.perf_counter() - t0
    engine = load_engine(folder, device=device, load="dummy", dtype="bfloat16")
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    t_built = time.perf_counter() - t0
    runner = engine.graph_runner
    record = dict(
        import_s=t_import,
        built_s=t_built,
        capture_s=runner.capture_seconds if runner is not None else 0.0,
        graphs=len(runner.graphs) if runner is not None else 0,
    )
    print("STARTUP " + json.dumps(record), flush=True)


def run_child(folder: Path, device: str, cache_dir: Path, autotune_cache: str, timeout_s: float) -> dict:
    env = dict(os.environ)
    env.pop("TRITON_CACHE_AUTOTUNING", None)
    env.update(
        TRITON_CACHE_DIR=str(cache_dir),
        TOKENROUTER_AUTOTUNE_CACHE=autotune_cache,
        TRITON_PRINT_AUTOTUNING="1",
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(folder), "--device", device],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("STARTUP "))
    record = json.loads(line[len("STARTUP ") :])
    tuned = [float(m.group(1)) for m in _TUNED.finditer(proc.stdout)]
    record.update(process_s=wall, tuned_kernels=len(tuned), tuning_s=sum(tuned))
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qwen3-0.6b,qwen3-8b")
    ap.add_argument("--out", default="out/startup")
    ap.add_argument("--work", default=None, help="model folders and Triton caches (default: under --out)")
    ap.add_argument("--timeout-s", type=float, default=400.0, help="per process")
    ap.add_argument(
        "--device", default="cuda", help="cuda (the measurement) or cpu (a smoke test: no graphs)"
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.device)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or out / "work")
    work.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    print("| shape | start | what is on disk | process (s) | imports (s) | engine built (s) | graph capture "
          "(s), graphs | kernels tuned | tuning (s) |")  # fmt: skip
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    for shape in args.shapes.split(","):
        folder = work / shape
        if not (folder / "config.json").exists():
            subprocess.run(
                [sys.executable, "-m", "tokenrouter.cli", "make-model", str(folder), "--shape", shape],
                check=True,
                capture_output=True,
            )
        cache_dir = work / f"triton-cache-{shape}"
        if cache_dir.exists():
            raise SystemExit(
                f"{cache_dir} exists: the cold start needs an empty Triton cache (pass a new --work)"
            )
        cache_dir.mkdir()
        for name, autotune_cache, what in SCENARIOS:
            r = run_child(folder, args.device, cache_dir, autotune_cache, args.timeout_s)
            r.update(shape=shape, start=name, autotune_cache=autotune_cache == "1")
            results.append(r)
            (out / "startup_bench.json").write_text(json.dumps(results, indent=1))
            print(f"| {shape} | {name} | {what} | {r['process_s']:.1f} | {r['import_s']:.1f} | {r['built_s']:.1f} | "
                  f"{r['capture_s']:.1f}, {r['graphs']} | {r['tuned_kernels']} | {r['tuning_s']:.1f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
