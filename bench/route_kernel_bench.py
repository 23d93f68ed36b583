"""Route-kernel benchmark (issue 4): the fused Triton route kernel against the unfused torch sequence
(softmax, entropy, top-k, sampling, comparisons), the torch renderer, and the floor of reading the logits
once (bytes / measured bandwidth). Vocabulary 151,936, bs 1 / 8 / 64, fp32 and bf16 logits, greedy and
sampled rows. Every variant runs inside a CUDA graph (as decode steps do), cycling over enough logits
buffers that at bs = 64 they do not fit in L2. Needs CUDA.

    python bench/route_kernel_bench.py [--sweep] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch


def policy_ir() -> dict:
    """A block that reads every distribution statistic: confidence, margin, entropy, logprob, uniform()."""
    nodes = [
        {"op": "feature", "name": "confidence", "type": "float"},  # 0
        {"op": "const", "value": 0.3, "type": "float"},  # 1
        {"op": "lt", "args": [0, 1], "type": "bool"},  # 2
        {"op": "feature", "name": "margin", "type": "float"},  # 3
        {"op": "const", "value": 0.05, "type": "float"},  # 4
        {"op": "lt", "args": [3, 4], "type": "bool"},  # 5
        {"op": "feature", "name": "norm_entropy", "type": "float"},  # 6
        {"op": "const", "value": 0.15, "type": "float"},  # 7
        {"op": "gt", "args": [6, 7], "type": "bool"},  # 8
        {"op": "and", "args": [5, 8], "type": "bool"},  # 9
        {"op": "feature", "name": "logprob", "type": "float"},  # 10
        {"op": "const", "value": -6.0, "type": "float"},  # 11
        {"op": "lt", "args": [10, 11], "type": "bool"},  # 12
        {"op": "uniform", "type": "float"},  # 13
        {"op": "const", "value": 0.01, "type": "float"},  # 14
        {"op": "lt", "args": [13, 14], "type": "bool"},  # 15
        {"op": "or", "args": [12, 15], "type": "bool"},  # 16
    ]
    rule = lambda cond, target: {"cond": cond, "target": target, "drop": False, "for": None}  # noqa: E731
    return {"model": "slm", "features": ["confidence", "logprob", "margin", "norm_entropy"], "routers": [],
            "uses_uniform": True, "nodes": nodes, "rules": [rule(2, "llm"), rule(9, "mid"), rule(16, "llm")]}  # fmt: skip


def unfused(logits: torch.Tensor, st) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same decision as plain torch ops, one statistic at a time (what a hand-written step would do)."""
    from tokenrouter.runtime.rng import STREAM_UNIFORM, uniform
    from tokenrouter.runtime.sampling import sample

    x = logits.float()
    p = torch.softmax(x, dim=-1)
    logp = torch.log_softmax(x, dim=-1)
    entropy = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)
    top2 = p.topk(2, dim=-1).values
    conf, margin = top2[:, 0], top2[:, 0] - top2[:, 1]
    token = sample(x, st.temperature, st.top_k, st.top_p, st.seed, st.position, restrict=False,
                   all_greedy=not st.any_sampling)  # fmt: skip
    logprob = logp.gather(1, token[:, None])[:, 0]
    u = uniform(st.seed, st.position, STREAM_UNIFORM, torch.zeros_like(st.position))
    rule = torch.where(conf < 0.3, 0, -1)
    rule = torch.where((rule < 0) & (margin < 0.05) & (entropy / math.log(x.shape[1]) > 0.15), 1, rule)
    rule = torch.where((rule < 0) & ((logprob < -6.0) | (u < 0.01)), 2, rule)
    return token, logprob, rule


def graph_time_us(step, n_buffers: int, reps: int) -> float:
    """Mean µs of one `step(k)`: a CUDA graph of one step per buffer, replayed `reps` times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for k in range(n_buffers):
            step(k)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for k in range(n_buffers):
            step(k)
    for _ in range(3):
        graph.replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1000.0 / (reps * n_buffers)


def bandwidth_gbs() -> dict[str, float]:
    """Read bandwidth (a sum over 2 GiB) and copy bandwidth (read + write counted), in GB/s."""
    n = 1 << 29
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    out = {}
    for name, fn, nbytes in (("read", lambda: src.sum(), 4 * n), ("copy", lambda: dst.copy_(src), 8 * n)):
        for _ in range(3):
            fn()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            fn()
        stop.record()
        torch.cuda.synchronize()
        out[name] = nbytes * 20 / (start.elapsed_time(stop) / 1000.0) / 1e9
    return out


def make_state(rows: int, sampled: bool):
    from tokenrouter.runtime.route import RouteBatchState

    st = RouteBatchState.make(rows, "cuda", seed=list(range(1, rows + 1)), position=[100 + i for i in range(rows)],
                              temperature=0.8 if sampled else 0.0, run_length=1, generated=40)  # fmt: skip
    st.any_sampling, st.any_restricted = sampled, False
    return st


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--sweep", action="store_true", help="also sweep BLOCK x SPLIT at the largest batch")
    ap.add_argument("--only-sweep", action="store_true", help="skip the main table")
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("route_kernel_bench: needs a CUDA device (the fused kernel is Triton)", file=sys.stderr)
        return 2
    from tokenrouter.runtime.route import RouteKernel

    torch.manual_seed(0)
    plan = {"routes": {"slm": policy_ir()}, "routers": {}, "models": {}}
    bw = bandwidth_gbs()
    best_bw = max(bw.values())
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}; "
          f"read {bw['read']:.0f} GB/s, copy {bw['copy']:.0f} GB/s (floor uses {best_bw:.0f} GB/s)")  # fmt: skip
    l2 = 50 * 2**20
    rows_out = []
    header = ("| bs | logits | rows | fused µs | torch renderer µs | unfused torch µs | floor µs | "
              "vs unfused | fused / floor | split × block |")  # fmt: skip
    print(header)
    print("|" + "---|" * 10)
    torch_ref = RouteKernel(plan, "slm", "torch", "cuda")
    fused = RouteKernel(plan, "slm", "triton", "cuda")
    for rows in [] if args.only_sweep else [int(b) for b in args.batches.split(",")]:
        for dtype in (torch.float32, torch.bfloat16):
            nbytes = rows * args.vocab * dtype.itemsize
            n_buf = max(1, min(16, math.ceil(4 * l2 / nbytes)))
            bufs = [(torch.randn(rows, args.vocab, device="cuda") * 4).to(dtype) for _ in range(n_buf)]
            for sampled in (False, True):
                st = make_state(rows, sampled)
                a, b = torch_ref(bufs[0], None, st), fused(bufs[0], None, st)
                c = unfused(bufs[0], st)
                same = torch.equal(a.token, b.token) and torch.equal(a.rule, b.rule)
                if not same or not torch.equal(a.token, c[0]):
                    print(f"# CHECK FAILED bs={rows} {dtype} sampled={sampled}: fused==torch renderer {same}, "
                          f"unfused tokens agree {torch.equal(a.token, c[0])}")  # fmt: skip
                t_fused = graph_time_us(
                    lambda k, bufs=bufs, st=st: fused(bufs[k], None, st), n_buf, args.reps
                )
                t_ref = graph_time_us(
                    lambda k, bufs=bufs, st=st: torch_ref(bufs[k], None, st), n_buf, max(5, args.reps // 5)
                )
                t_unf = graph_time_us(
                    lambda k, bufs=bufs, st=st: unfused(bufs[k], st), n_buf, max(5, args.reps // 5)
                )
                floor = nbytes / (best_bw * 1e9) * 1e6
                split, block, _ = fused._triton.config(rows, args.vocab)
                row = dict(bs=rows, dtype=str(dtype).split(".")[1], sampled=sampled, fused_us=t_fused,
                           torch_renderer_us=t_ref, unfused_us=t_unf, floor_us=floor, split=split, block=block)  # fmt: skip
                rows_out.append(row)
                print(f"| {rows} | {row['dtype']} | {'sampled T=0.8' if sampled else 'greedy'} | {t_fused:.1f} | "
                      f"{t_ref:.1f} | {t_unf:.1f} | {floor:.2f} | {t_unf / t_fused:.1f}× | {t_fused / floor:.2f}× | "
                      f"{split} × {block} |")  # fmt: skip
            del bufs
    if args.sweep or args.only_sweep:
        rows = max(int(b) for b in args.batches.split(","))
        greedy = make_state(rows, False)
        print(f"\n# sweep at bs={rows}, greedy rows: fused µs (fused / floor) per block × split")
        configs = [(2048, 1), (2048, 2), (2048, 4), (2048, 8), (2048, 16), (1024, 8), (4096, 4)]
        print("| logits | " + " | ".join(f"{b}×{sp}" for b, sp in configs) + " |")
        print("|" + "---|" * (len(configs) + 1))
        for dtype in (torch.float32, torch.bfloat16):
            nbytes = rows * args.vocab * dtype.itemsize
            n_buf = max(1, min(16, math.ceil(4 * l2 / nbytes)))
            bufs = [(torch.randn(rows, args.vocab, device="cuda") * 4).to(dtype) for _ in range(n_buf)]
            floor = nbytes / (best_bw * 1e9) * 1e6
            cells = []
            for block, split in configs:
                k = RouteKernel(plan, "slm", "triton", "cuda", split=split, block=block)
                if not torch.equal(k(bufs[0], None, greedy).rule, torch_ref(bufs[0], None, greedy).rule):
                    print(f"# CHECK FAILED sweep {dtype} block={block} split={split}")
                g = graph_time_us(lambda i, k=k, bufs=bufs: k(bufs[i], None, greedy), n_buf, args.reps)
                rows_out.append(dict(bs=rows, dtype=str(dtype).split(".")[1], fused_greedy_us=g, floor_us=floor,
                                     split=split, block=block, sweep=True))  # fmt: skip
                cells.append(f"{g:.1f} ({g / floor:.2f}×)")
            print(f"| {str(dtype).split('.')[1]} | " + " | ".join(cells) + " |")
            del bufs
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "bandwidth_gbs": bw, "rows": rows_out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
