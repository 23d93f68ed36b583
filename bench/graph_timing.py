"""Timing GPU work as a CUDA graph, shared by the kernel benchmarks
(`route_kernel_bench`): capture the work once (compiled and warmed up on a side stream
first, so that no compile or autotune lands in the graph), then time back-to-back replays with CUDA events,
so that the figure is the GPU's time for the work and not Python's launch cost."""

from __future__ import annotations

from collections.abc import Callable

import torch


def capture(work: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """`work` run once on a side stream (compiles, autotunes, warms caches), then captured as a graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        work()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    return graph


def replay_us(graph: torch.cuda.CUDAGraph, reps: int, warmup: int = 3) -> float:
    """Mean microseconds per replay over `reps` back-to-back replays (after `warmup` untimed ones)."""
    for _ in range(warmup):
        graph.replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1e3 / reps
