"""Thirty-eighth session: why did the KV pool's old free (torch.cat of the whole free list per release) cost
8.8 ms per row with two subservers on the device machine, against 0.6 ms with one? Times that copy in one
process and in two at once, at several torch thread counts, and prints what the machine allots."""

import json
import multiprocessing as mp
import os
import statistics
import sys
import time


def machine():
    import torch

    out = {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "interop": torch.get_num_interop_threads(),
    }
    for p in (
        "/sys/fs/cgroup/cpu.max",
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
        "/sys/fs/cgroup/cpu/cpu.cfs_period_us",
    ):
        try:
            out[p] = open(p).read().strip()
        except OSError:
            pass
    out["parallel_info"] = [line for line in torch.__config__.parallel_info().splitlines() if line.strip()][
        :8
    ]
    return out


def worker(n, threads, iters, barrier, q):
    import torch

    if threads:
        torch.set_num_threads(threads)
    free = torch.arange(1, n + 1, dtype=torch.int64)
    small = torch.arange(600, dtype=torch.int64)
    barrier.wait()
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        free = torch.cat([free, small])[:n]
        ts.append((time.perf_counter() - t) * 1e3)
    q.put((torch.get_num_threads(), statistics.median(ts), max(ts)))


def run(n, procs, threads, iters=300):
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=worker, args=(n, threads, iters, barrier, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    res = [q.get() for _ in ps]
    for p in ps:
        p.join()
    return res


if __name__ == "__main__":
    print(json.dumps(machine()))
    print("| pool ids | processes | torch threads | median ms per cat | max ms |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n in (int(a) for a in sys.argv[1:] or ("400000", "1500000")):
        for threads in (0, 2, 1):
            for procs in (1, 2):
                res = run(n, procs, threads)
                print(
                    f"| {n} | {procs} | {res[0][0]} | {max(r[1] for r in res):.3f} | {max(r[2] for r in res):.3f} |",
                    flush=True,
                )
