"""What a CUDA-graph step costs the host (issue 7: the 0.6B subserver's step took ~2 ms at 3 rows against a
1.25 ms graph replay; torch.profiler put ~0.7 ms per step in `cudaGraphLaunch`).

For the engine's captured decode graphs (`--shape`, dummy weights) with the fast path as configured and
with each `--off` option turned off (TOKENROUTER_ENGINE_OFF, e.g. `pdl`), per graph:

  launch µs   host wall time of `graph.replay()` alone, the device idle before it (median)
  step µs     from before the launch to the end of a device sync (median): what a synchronous step pays
  gpu µs      per replay, replays back to back (device time; the launches overlap the previous replay)

and, for comparison, straight-line graphs of N tiny kernels (one `add_` each), captured the same way.

    python bench/graph_launch_bench.py --shape qwen3-0.6b --bs 1,4 --off pdl [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench.graph_timing import replay_us  # noqa: E402
from tokenrouter.runtime.engine.attention.triton_backend import ENGINE_OFF_ENV  # noqa: E402
from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig  # noqa: E402


def time_graph(graph: torch.cuda.CUDAGraph, reps: int) -> dict[str, float]:
    launch, step = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        launch.append((t1 - t0) * 1e6)
        step.append((t2 - t0) * 1e6)
    torch.cuda.synchronize()
    return {
        "launch_us": statistics.median(launch),
        "step_us": statistics.median(step),
        "gpu_us": replay_us(graph, reps, warmup=0),
    }


def tiny_graph(n: int) -> torch.cuda.CUDAGraph:
    x = torch.zeros(16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            x.add_(1.0)
    g._keep = x  # noqa: SLF001 — keep the buffer alive with the graph
    return g


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--bs", default="1,4")
    ap.add_argument(
        "--off", default="pdl", help="comma list of fast-path options to also run without, one at a time"
    )
    ap.add_argument("--tiny", default="50,300", help="kernel counts of the straight-line comparison graphs")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("graph_launch_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    from engine_bench import build_engine

    sizes = tuple(int(b) for b in a.bs.split(","))
    rows = []
    base_off = os.environ.get(ENGINE_OFF_ENV, "")
    for off in [""] + [o for o in a.off.split(",") if o]:
        os.environ[ENGINE_OFF_ENV] = ",".join(filter(None, [base_off, off]))
        engine = build_engine(
            a.shape, 4096, max(sizes), graphs=True, graph_config=CudaGraphConfig(sizes, (), ())
        )
        for bs in sizes:
            r = time_graph(engine.graph_runner.graphs[(bs, 1)], a.reps)
            rows.append({"graph": f"{a.shape} decode bs {bs}", "off": off or "-", **r})
        del engine
        torch.cuda.empty_cache()
    os.environ[ENGINE_OFF_ENV] = base_off
    for n in (int(x) for x in a.tiny.split(",") if x):
        rows.append({"graph": f"{n} x add_ (straight line)", "off": "-", **time_graph(tiny_graph(n), a.reps)})
    print(f"## Graph launch cost on {torch.cuda.get_device_name()} (torch {torch.__version__})\n")
    print("| graph | off | launch µs (host) | step µs (launch + sync) | gpu µs (back to back) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['graph']} | {r['off']} | {r['launch_us']:.1f} | {r['step_us']:.1f} | {r['gpu_us']:.1f} |"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
