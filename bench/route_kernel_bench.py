"""Route-kernel benchmark (issue 4): the fused Triton route kernel against the unfused torch sequence
(softmax, entropy, top-k, sampling, comparisons), the torch renderer, the kernel as measured at d6f8f70
(`bench/route_kernel_v1/`: per-element online softmax and a Gumbel draw per vocabulary entry), a measured
read of the logits once (a Triton kernel that only reads them, on the fused kernel's grid and tiling, and
torch's `amax(-1)`) and the floor of reading the logits once (bytes / measured bandwidth). Vocabulary
151,936, bs 1 / 8 / 64, fp32 and bf16 logits, greedy and sampled rows. Every variant runs inside a CUDA graph
(as decode steps do), cycling over enough logits buffers that at bs = 64 they do not fit in L2. Needs CUDA.

    python bench/route_kernel_bench.py [--sweep] [--stdlib] [--dtypes bf16,fp32] [--prefetch on,off,2]
                                       [--tail-split | --tail-split-only] [--json FILE] [--md FILE] [--budget-s S]
    python bench/route_kernel_bench.py --smoke   # CPU, Triton's interpreter, vocab 5000: checks this script

`--prefetch`: the fused kernel's tile pipeline (`LaunchOptions.prefetch`: tiles loaded ahead in registers),
each value timed in the same run, with a bit-for-bit check against the first. `--sweep`: launch variants
at the largest batch (bf16 first), including Triton's own pipeliner (stages) and smaller tiles with more
programs per SM, each beside the read-only kernel at the same launch. `--tail-split` (`--tail-split-only`:
nothing else): where the sampled rows' time goes at the largest batch, both samplers ("strided", the default,
and "cdf"), each with its serial tail cut short by the render-time debug flag (`debug_tail`: "chunk"
stops after the chunk choice, "none" skips the draw; benchmarks only, those kernels' tokens are wrong).

Blocks: `policy_ir()` reads every statistic (confidence, margin, norm_entropy, logprob, uniform());
`--stdlib` adds the statistics the stdlib policies actually read: token and logprob only (bernoulli, citer,
co_llm, r2r, multi_expert: their routers run outside the kernel) and norm_entropy (r_stitch).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tokenrouter and bench.graph_timing, without PYTHONPATH
    sys.path.insert(0, str(ROOT))

from bench.graph_timing import capture, replay_us  # noqa: E402
from tokenrouter.runtime.sampling import DEFAULT_SAMPLER, SAMPLERS  # noqa: E402


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


def stdlib_irs() -> dict[str, dict]:
    """Blocks with the statistics the stdlib policies read (router outputs come from outside the kernel)."""
    rule = lambda cond: {"cond": cond, "target": "llm", "drop": False, "for": None}  # noqa: E731
    token_logprob = {"model": "slm", "features": ["logprob"], "routers": [], "uses_uniform": True, "nodes": [
        {"op": "feature", "name": "logprob", "type": "float"}, {"op": "const", "value": -6.0, "type": "float"},
        {"op": "lt", "args": [0, 1], "type": "bool"}, {"op": "uniform", "type": "float"},
        {"op": "const", "value": 0.3, "type": "float"}, {"op": "lt", "args": [3, 4], "type": "bool"}],
        "rules": [rule(2), rule(5)]}  # fmt: skip
    norm_entropy = {"model": "slm", "features": ["norm_entropy"], "routers": [], "uses_uniform": False, "nodes": [
        {"op": "feature", "name": "norm_entropy", "type": "float"}, {"op": "const", "value": 0.2, "type": "float"},
        {"op": "gt", "args": [0, 1], "type": "bool"}], "rules": [rule(2)]}  # fmt: skip
    return {"token+logprob (bernoulli, citer, co_llm, r2r, multi_expert)": token_logprob,
            "norm_entropy (r_stitch)": norm_entropy}  # fmt: skip


def unfused(
    logits: torch.Tensor, st, sampler: str = DEFAULT_SAMPLER
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
                   all_greedy=not st.any_sampling, sampler=sampler)  # fmt: skip
    logprob = logp.gather(1, token[:, None])[:, 0]
    u = uniform(st.seed, st.position, STREAM_UNIFORM, torch.zeros_like(st.position))
    rule = torch.where(conf < 0.3, 0, -1)
    rule = torch.where((rule < 0) & (margin < 0.05) & (entropy / math.log(x.shape[1]) > 0.15), 1, rule)
    rule = torch.where((rule < 0) & ((logprob < -6.0) | (u < 0.01)), 2, rule)
    return token, logprob, rule


DEVICE = "cuda"


def graph_time_us(step, n_buffers: int, reps: int) -> float:
    """Mean µs of one `step(k)`: a CUDA graph of one step per buffer, replayed `reps` times."""
    if DEVICE == "cpu":  # --smoke: wall time of one pass, no graphs
        t0 = time.perf_counter()
        for k in range(n_buffers):
            step(k)
        return (time.perf_counter() - t0) * 1e6 / n_buffers

    def steps() -> None:
        for k in range(n_buffers):
            step(k)

    return replay_us(capture(steps), reps) / n_buffers


def bandwidth_gbs() -> dict[str, float]:
    """Read bandwidth (a sum over 2 GiB) and copy bandwidth (read + write counted), in GB/s."""
    if DEVICE == "cpu":
        return {"read": 1.0, "copy": 1.0}
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


_READ_KERNEL = None


def read_kernel():
    """A Triton kernel that reads the logits once on the route kernel's grid and tiling and does nothing
    else: each program keeps an element-wise running max of its tiles in registers (no reduction across
    threads inside the loop) and stores its chunk's max. TILE_MAX = True adds what the route kernel does per
    tile before its exponentials: the tile's max as a block-wide reduction (shuffles and a barrier) into a
    running scalar. Defined on first use: TRITON_INTERPRET must be set before triton is imported."""
    global _READ_KERNEL
    if _READ_KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def row_max_kernel(x_ptr, stride_row, V, CHUNK, out_ptr, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
                           PREFETCH: tl.constexpr, STAGES: tl.constexpr, TILE_MAX: tl.constexpr):  # fmt: skip
            row = tl.program_id(0).to(tl.int64)
            part = tl.program_id(1)
            start = part * CHUNK
            end = tl.minimum(start + CHUNK, V)
            full_end = start + (tl.maximum(end - start, 0) // BLOCK) * BLOCK
            p = x_ptr + row * stride_row
            cols = tl.arange(0, BLOCK)
            acc = tl.full([BLOCK], float("-inf"), tl.float32)
            m = tl.full([], float("-inf"), tl.float32)
            if PREFETCH >= 1:  # the route kernel's pipeline: PREFETCH tiles loaded ahead
                x_next = tl.load(p + start + cols, mask=start + cols < full_end, other=float("-inf"))
            if PREFETCH >= 2:
                x_next2 = tl.load(p + start + BLOCK + cols, mask=start + BLOCK + cols < full_end, other=0.0)
            for off in tl.range(start, full_end, BLOCK, num_stages=STAGES if STAGES > 0 else None):
                if PREFETCH == 0:
                    x = tl.load(p + tl.multiple_of(off, BLOCK) + cols)
                elif PREFETCH == 1:
                    x = x_next
                    nxt = tl.multiple_of(off + BLOCK, BLOCK)
                    x_next = tl.load(p + nxt + cols, mask=cols * 0 + nxt < full_end)
                else:
                    x = x_next
                    x_next = x_next2
                    nxt = tl.multiple_of(off + 2 * BLOCK, BLOCK)
                    x_next2 = tl.load(p + nxt + cols, mask=cols * 0 + nxt < full_end)
                if TILE_MAX:
                    m = tl.maximum(m, tl.max(x.to(tl.float32), 0))
                else:
                    acc = tl.maximum(acc, x.to(tl.float32))
            x = tl.load(p + full_end + cols, mask=full_end + cols < end, other=float("-inf"))
            acc = tl.maximum(acc, x.to(tl.float32))
            tl.store(out_ptr + row * SPLIT + part, tl.maximum(tl.max(acc, 0), m))

        _READ_KERNEL = row_max_kernel
    return _READ_KERNEL


def read_once_us(bufs, split: int, block: int, warps: int, prefetch: int, stages: int, reps: int,
                 tile_max: bool = False) -> float:  # fmt: skip
    """Time of `read_kernel()` over `bufs` with the route kernel's launch (split x block x warps); checks the
    row maxima against torch first."""
    rows, vocab = bufs[0].shape
    chunk = math.ceil(math.ceil(vocab / split) / block) * block
    out = torch.empty(rows * split, dtype=torch.float32, device=DEVICE)
    kern = read_kernel()

    def step(k: int) -> None:
        kern[(rows, split)](bufs[k], bufs[k].stride(0), vocab, chunk, out, SPLIT=split, BLOCK=block,
                            PREFETCH=prefetch, STAGES=stages, TILE_MAX=tile_max, num_warps=warps)  # fmt: skip

    step(0)
    got = out.view(rows, split).amax(1)
    if not torch.equal(got, bufs[0].float().amax(1)):
        print(f"# CHECK read-once kernel {split}x{block}x{warps}: wrong row maxima", flush=True)
    return graph_time_us(step, len(bufs), reps)


def amax_us(bufs, reps: int) -> float:
    """torch's row max (`amax(-1)`) over the same buffers: a read of the logits by a library reduction."""
    return graph_time_us(lambda k: bufs[k].amax(-1), len(bufs), reps)


def same_bits(a, b) -> bool:
    """Two route results with the same tokens, rules and logprobs, bit for bit."""
    return bool(torch.equal(a.token, b.token) and torch.equal(a.rule, b.rule)
                and torch.equal(a.logprob.view(torch.int32), b.logprob.view(torch.int32)))  # fmt: skip


def prefetch_list(text: str) -> list[int]:
    """--prefetch: comma-separated tile distances; on = 1 (the default pipeline), off = 0."""
    names = {"on": 1, "off": 0}
    try:
        out = [names[x] if x in names else int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prefetch takes on, off, 0, 1 or 2, got {text!r}") from None
    if not out or any(p not in (0, 1, 2) for p in out):
        raise argparse.ArgumentTypeError(f"--prefetch takes on, off, 0, 1 or 2, got {text!r}")
    return out


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def dtype_list(text: str) -> list[torch.dtype]:
    try:
        return [DTYPES[x] for x in text.split(",")]
    except KeyError:
        raise argparse.ArgumentTypeError(f"--dtypes takes fp32 and/or bf16, got {text!r}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]


# sweep at the largest batch: (block, warps, split, prefetch, stages); bf16 first (an earlier sweep's time ran
# out before its cells). At bs 64 split 4 is 256 programs (2 per SM fit: 8192-value tiles) and split 8 is 512
# (4 per SM fit: the 2048-value tiles, or 4096 at 4 warps with stages), so every cell runs in one wave (sm_90
# registers by route_compile_check-style builds). bf16 needs warps * 32 * 8 <= 2048.
SWEEP = {
    torch.bfloat16: [(8192, 8, 4, 1, 0), (8192, 8, 4, 0, 0), (8192, 8, 4, 0, 3), (8192, 8, 4, 0, 4),
                     (4096, 8, 4, 1, 0), (4096, 8, 4, 2, 0), (4096, 8, 4, 0, 3), (2048, 4, 8, 1, 0),
                     (2048, 8, 8, 2, 0), (4096, 4, 8, 0, 3)],
    torch.float32: [(4096, 8, 4, 1, 0), (4096, 8, 4, 0, 0), (4096, 8, 4, 0, 3), (4096, 8, 4, 2, 0),
                    (2048, 8, 8, 1, 0), (2048, 8, 8, 2, 0), (2048, 8, 8, 0, 3), (2048, 4, 8, 1, 0)],
}  # fmt: skip


SWEEP_TEMPS = {"greedy": 0.0, "sampled": 0.8}


def config_label(block: int, warps: int, split: int, prefetch: int, stages: int) -> str:
    return f"{block}×{warps}w×{split} p{prefetch}" + (f" st{stages}" if stages else "")


def make_state(rows: int, temperature: float):
    from tokenrouter.runtime.route import RouteBatchState

    st = RouteBatchState.make(rows, DEVICE, seed=list(range(1, rows + 1)), position=[100 + i for i in range(rows)],
                              temperature=temperature, run_length=1, generated=40)  # fmt: skip
    st.any_sampling, st.any_restricted = temperature > 0, False
    return st


L2_BYTES = 50 * 2**20


def buffers(rows: int, vocab: int, dtype) -> list[torch.Tensor]:
    n_buf = max(1, min(16, math.ceil(4 * L2_BYTES / (rows * vocab * dtype.itemsize))))
    if DEVICE == "cpu":
        n_buf = 1
    return [(torch.randn(rows, vocab, device=DEVICE) * 4).to(dtype) for _ in range(n_buf)]


def mode_name(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"sampled T={temperature:g}"


class Report:
    def __init__(self, md_path: str | None) -> None:
        self.lines: list[str] = []
        self.md_path = md_path

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)
        if self.md_path:  # as it goes: a run cut short still leaves its tables
            with open(self.md_path, "w") as f:
                f.write("\n".join(self.lines) + "\n")


# --tail-split rows: (label, temperature, sampler, debug_tail, sampling kernel for greedy rows, launch):
# launch None = the default, "greedy" = the greedy rows' tile, (split, block, warps) = that launch (bf16 only:
# the best bf16 sampled cell of the sweep on the H200)
TAIL_CELLS = [
    ("greedy", 0.0, "cdf", "full", False, None),
    ("greedy rows, sampling kernel", 0.0, "cdf", "full", True, None),
    *[(f"sampled T={t:g}", t, sampler, tail, True, None)
      for t in (1.0, 0.8) for sampler in ("cdf", "strided") for tail in ("none", "full")],
    *[(f"sampled T={t:g}", t, sampler, "chunk", True, None) for t in (1.0, 0.8) for sampler in ("cdf", "strided")],
    *[(f"sampled T={t:g}, greedy's tile", t, "strided", "full", True, "greedy") for t in (1.0, 0.8)],
    *[(f"sampled T={t:g}, 2048×4w×8", t, sampler, "full", True, (8, 2048, 4))
      for sampler in ("cdf", "strided") for t in (1.0, 0.8)],
]  # fmt: skip


def tail_split(args, out, plan: dict, rows_out: list, best_bw: float, t_start: float) -> None:
    """The --tail-split table: at the largest batch, greedy rows (the greedy kernel; the sampling kernel on
    greedy rows: its launch and registers), then sampled rows per sampler with the draw after the row's
    merge removed ("none": main pass, partials and ticket only), stopped after the chunk choice ("chunk")
    and whole ("full"); the strided sampler also at the greedy kernel's tile. Tokens of the full kernels
    are checked against the torch renderer with the same sampler. Cells past --budget-s show (time), most
    wanted first."""
    from tokenrouter.compiler.kernels import render_route_kernel
    from tokenrouter.runtime.route import RouteKernel
    from tokenrouter.runtime.route.loader import load_source
    from tokenrouter.runtime.route.triton_backend import SAMPLED_TILE

    rows = max(int(b) for b in args.batches.split(","))
    out(f"\n## Where the sampled rows' time goes, bs {rows}, every statistic (--tail-split)\n")
    out("tail none: the sampled rows' draw removed (the main pass with the sampler's per-tile or per-program "
        "work, partials, ticket, merge); chunk: the draw stopped after the chunk choice; full: the whole draw. "
        "Debug kernels (`debug_tail`), benchmarks only. read: the read-once kernel at the same launch.\n")  # fmt: skip
    out("| logits | rows | sampler | tail | fused µs | read µs | floor µs | fused / read | split × block × warps |")  # fmt: skip
    out("|" + "---|" * 9)
    kernels: dict = {}
    greedy_blocks: dict = {}
    t_read: dict = {}
    dtypes = sorted(args.dtypes, key=lambda d: d != torch.bfloat16)
    # the greedy rows and the sampled rows without / with the draw, every dtype; then the rest
    for dtype, cells in [(d, TAIL_CELLS[:10]) for d in dtypes] + [(d, TAIL_CELLS[10:]) for d in dtypes]:
        bufs = buffers(rows, args.vocab, dtype)
        floor = rows * args.vocab * dtype.itemsize / (best_bw * 1e9) * 1e6
        refs: dict = {}
        greedy_block = greedy_blocks.get(dtype)
        for label, temp, sampler, tail, sampling_kernel, block in cells:
            if isinstance(block, tuple) and dtype != torch.bfloat16:
                continue
            if block == "greedy" and (greedy_block is None or greedy_block <= SAMPLED_TILE):
                continue  # the sampled rows' tile already: nothing new to time
            if time.time() - t_start > args.budget_s:
                out(f"| {dtype_name(dtype)} | {label} | {sampler if temp > 0 else '–'} | {tail if temp > 0 else '–'} | "
                    "(time) | | | | |")  # fmt: skip
                continue
            key = (sampler, tail, block)
            if key not in kernels:
                split, blk, warps = block if isinstance(block, tuple) else (None, None, None)
                k = RouteKernel(
                    plan, "slm", "triton", DEVICE, sampler=sampler, split=split, block=blk, warps=warps
                )
                if tail != "full":
                    src = render_route_kernel(k.spec, "triton", sampler=sampler, debug_tail=tail)
                    k._triton.module = load_source(src, f"triton_slm_{sampler}_{tail}")
                kernels[key] = k
            k = kernels[key]
            if block == "greedy":
                k._triton.options.block = greedy_block
            st = make_state(rows, temp)
            st.any_sampling = sampling_kernel
            if tail == "full":
                if (sampler, temp) not in refs:
                    ref = RouteKernel(plan, "slm", "torch", DEVICE, sampler=sampler)
                    refs[(sampler, temp)] = ref(bufs[0], None, st)
                want, got = refs[(sampler, temp)], k(bufs[0], None, st)
                bad = int(((want.token != got.token) | (want.rule != got.rule)).sum())
                if bad:
                    out(f"# CHECK tail-split {dtype_name(dtype)} {label} {sampler}: {bad} of {rows} rows differ from "
                        "the torch renderer (a near-tie now and then is expected; more is a bug)")  # fmt: skip
            g = graph_time_us(lambda i, k=k, bufs=bufs, st=st: k(bufs[i], None, st), len(bufs), args.reps)
            split, blk, warps = k._triton.config(rows, args.vocab, dtype.itemsize, sampling_kernel)
            if label == "greedy":
                greedy_block = greedy_blocks[dtype] = blk
            if (dtype, split, blk, warps) not in t_read:
                t_read[(dtype, split, blk, warps)] = read_once_us(bufs, split, blk, warps, 1, 0, args.reps)
            rd = t_read[(dtype, split, blk, warps)]
            rows_out.append(dict(table="tail_split", bs=rows, dtype=dtype_name(dtype), rows=label, temperature=temp,
                                 sampler=sampler, debug_tail=tail, fused_us=g, read_us=rd, floor_us=floor,
                                 split=split, block=blk, warps=warps))  # fmt: skip
            out(f"| {dtype_name(dtype)} | {label} | {sampler if temp > 0 else '–'} | {tail if temp > 0 else '–'} | "
                f"{g:.1f} | {rd:.1f} | {floor:.2f} | {g / rd:.2f}× | {split} × {blk} × {warps} |")  # fmt: skip
        del bufs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--dtypes", type=dtype_list, default=[torch.float32, torch.bfloat16],
                    help="logits dtypes, in this order: fp32,bf16 (default) or e.g. bf16")  # fmt: skip
    ap.add_argument("--prefetch", type=prefetch_list, default=[1],
                    help="tile prefetch distances to time side by side: on (= 1, the default), off (= 0), 2")  # fmt: skip
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--no-v1", action="store_true", help="skip the d6f8f70 kernel")
    ap.add_argument(
        "--no-torch", action="store_true", help="skip the torch renderer and the unfused sequence"
    )
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="also sweep block x warps x split x prefetch x stages at the largest batch",
    )
    ap.add_argument("--stdlib", action="store_true", help="also time the stdlib policies' statistics")
    ap.add_argument(
        "--tail-split",
        action="store_true",
        help="also time the sampled rows' parts at the largest batch (both samplers, debug tails)",
    )
    ap.add_argument("--tail-split-only", action="store_true", help="only the --tail-split table")  # fmt: skip
    ap.add_argument("--sampler", choices=SAMPLERS, default=DEFAULT_SAMPLER,
                    help="the two-stage draw of the main tables' kernels (--tail-split times both)")  # fmt: skip
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    ap.add_argument("--md", default=None, help="write the printed tables (markdown) here")
    ap.add_argument("--smoke", action="store_true", help="run every part on CPU under TRITON_INTERPRET=1")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=float("inf"),
        help="after this, skip the rest of the sweep and stdlib table",
    )
    args = ap.parse_args()
    global DEVICE
    if args.smoke:
        import os

        os.environ["TRITON_INTERPRET"] = "1"
        DEVICE = "cpu"
        args.vocab, args.batches, args.reps = 5000, "1,3", 1
    elif not torch.cuda.is_available():
        print("route_kernel_bench: needs a CUDA device (the fused kernel is Triton)", file=sys.stderr)
        return 2
    from route_kernel_v1 import KernelV1

    from tokenrouter.runtime.route import RouteKernel

    t_start = time.time()
    out = Report(args.md)
    torch.manual_seed(0)
    plan = {"routes": {"slm": policy_ir()}, "routers": {}, "models": {}}
    bw = bandwidth_gbs()
    best_bw = max(bw.values())
    import triton

    props = torch.cuda.get_device_properties(0) if DEVICE == "cuda" else argparse.Namespace(
        name="CPU (--smoke: Triton interpreter, times and floors meaningless)", multi_processor_count=0)  # fmt: skip
    out(f"# {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}; "
        f"read {bw['read']:.0f} GB/s, copy {bw['copy']:.0f} GB/s (floor uses {best_bw:.0f} GB/s)")  # fmt: skip
    rows_out: list[dict] = []

    def dump() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": props.name, "bandwidth_gbs": bw, "rows": rows_out}, f, indent=1)

    if args.tail_split_only:
        tail_split(args, out, plan, rows_out, best_bw, t_start)
        out(f"\n# {time.time() - t_start:.0f} s")
        dump()
        return 0
    torch_ref = RouteKernel(plan, "slm", "torch", DEVICE, sampler=args.sampler)
    fused = RouteKernel(plan, "slm", "triton", DEVICE, sampler=args.sampler)
    opts = fused._triton.options
    v1 = None if args.no_v1 else KernelV1(policy_ir(), DEVICE)
    batches = [int(b) for b in args.batches.split(",")]
    out(
        f"\n## Every statistic (confidence, margin, norm_entropy, logprob, uniform()); sampler {args.sampler}\n"
    )
    out("read µs: a Triton kernel that only reads the same logits once, on the fused kernel's split × block × "
        "warps and prefetch (an element-wise running max, one store per program); amax µs: torch's "
        "`amax(-1)` on the same buffers; floor µs: bytes / the measured bandwidth.\n")  # fmt: skip
    out("| bs | logits | rows | prefetch | fused µs | read µs | amax µs | d6f8f70 µs | torch renderer µs | "
        "unfused torch µs | floor µs | fused / read | fused / floor | d6f8f70 / fused | unfused / fused | "
        "split × block × warps |")  # fmt: skip
    out("|" + "---|" * 16)
    for rows in batches:
        for dtype in args.dtypes:
            bufs = buffers(rows, args.vocab, dtype)
            n_buf = len(bufs)
            nbytes = rows * args.vocab * dtype.itemsize
            floor = nbytes / (best_bw * 1e9) * 1e6
            t_amax = amax_us(bufs, args.reps)
            t_read: dict = {}
            temps = (0.0, 0.8, 1.0) if rows == max(batches) else (0.0, 0.8)
            for temp in temps:
                st = make_state(rows, temp)
                a = torch_ref(bufs[0], None, st)
                t_v1 = t_ref = t_unf = float("nan")
                if v1 is not None:
                    if temp == 0 and not torch.equal(v1(bufs[0], st)[0], a.token):
                        out(f"# CHECK FAILED bs={rows} {dtype}: d6f8f70 kernel's greedy tokens differ")
                    t_v1 = graph_time_us(lambda k, bufs=bufs, st=st: v1(bufs[k], st), n_buf, args.reps)
                if not args.no_torch and temp != 1.0:
                    if not torch.equal(a.token, unfused(bufs[0], st, args.sampler)[0]):
                        out(
                            f"# CHECK FAILED bs={rows} {dtype}: unfused tokens differ from the torch renderer"
                        )
                    slow_reps = max(5, args.reps // 5)
                    t_ref = graph_time_us(
                        lambda k, bufs=bufs, st=st: torch_ref(bufs[k], None, st), n_buf, slow_reps
                    )
                    t_unf = graph_time_us(
                        lambda k, bufs=bufs, st=st: unfused(bufs[k], st, args.sampler), n_buf, slow_reps
                    )
                first = None
                for prefetch in args.prefetch:
                    opts.prefetch = prefetch
                    b = fused(bufs[0], None, st)
                    bad = int(((a.token != b.token) | (a.rule != b.rule)).sum())
                    if bad:
                        out(f"# CHECK bs={rows} {dtype} {mode_name(temp)} prefetch {prefetch}: {bad} of {rows} rows "
                            "differ between the fused kernel and the torch renderer (sampled rows may differ at a "
                            "chunk boundary, about 1e-5 of draws; more than that is a bug)")  # fmt: skip
                    if first is None:
                        first = b
                    elif not same_bits(first, b):
                        out(f"# CHECK FAILED bs={rows} {dtype} {mode_name(temp)}: prefetch {prefetch} is not "
                            f"bit-identical to prefetch {args.prefetch[0]}")  # fmt: skip
                    t_fused = graph_time_us(
                        lambda k, bufs=bufs, st=st: fused(bufs[k], None, st), n_buf, args.reps
                    )
                    split, block, warps = fused._triton.config(rows, args.vocab, dtype.itemsize, temp > 0)
                    key = (split, block, warps, prefetch)
                    if key not in t_read:
                        t_read[key] = read_once_us(bufs, split, block, warps, prefetch, 0, args.reps)
                    t_rd = t_read[key]
                    row = dict(table="every_statistic", bs=rows, dtype=dtype_name(dtype), temperature=temp,
                               prefetch=prefetch, stages=opts.stages, fused_us=t_fused, read_us=t_rd,
                               amax_us=t_amax, v1_us=t_v1, torch_renderer_us=t_ref, unfused_us=t_unf,
                               floor_us=floor, split=split, block=block, warps=warps, mismatched_rows=bad)  # fmt: skip
                    rows_out.append(row)
                    out(f"| {rows} | {row['dtype']} | {mode_name(temp)} | {prefetch} | {t_fused:.1f} | {t_rd:.1f} | "
                        f"{t_amax:.1f} | {t_v1:.1f} | {t_ref:.1f} | {t_unf:.1f} | {floor:.2f} | "
                        f"{t_fused / t_rd:.2f}× | {t_fused / floor:.2f}× | {t_v1 / t_fused:.2f}× | "
                        f"{t_unf / t_fused:.1f}× | {split} × {block} × {warps} |")  # fmt: skip
                opts.prefetch = 1
            del bufs
            dump()
    rows = max(batches)
    if args.sweep:
        out(f"\n## Sweep at bs {rows}, every statistic: fused µs (fused / floor, fused / read) per "
            "block × warps × split, prefetch p, Triton pipeline stages st\n")  # fmt: skip
        out("read: the read-once kernel at the cell's launch; the `read` row is it alone, the `read + tile max` "
            "row adds a block-wide max reduction per tile (what the fused kernel does before its exponentials). "
            "Cells past the --budget-s budget show (time).\n")  # fmt: skip
        for dtype in sorted(args.dtypes, key=lambda d: d != torch.bfloat16):
            configs = SWEEP[dtype]
            out("| logits | rows | " + " | ".join(config_label(*c) for c in configs) + " |")
            out("|" + "---|" * (len(configs) + 2))
            bufs = buffers(rows, args.vocab, dtype)
            floor = rows * args.vocab * dtype.itemsize / (best_bw * 1e9) * 1e6
            t_read: dict = {}
            states = {name: make_state(rows, t) for name, t in SWEEP_TEMPS.items()}
            wants = {name: torch_ref(bufs[0], None, st) for name, st in states.items()}
            firsts: dict = {}  # (rows, block, warps, split) -> the first such cell: label, results

            def sweep_cell(config, part: str, dtype=dtype, bufs=bufs, floor=floor, t_read=t_read, states=states,
                           wants=wants, firsts=firsts) -> str:  # fmt: skip
                """One cell: the fused kernel (greedy or sampled rows) or the read-once kernel at `config`."""
                block, warps, split, prefetch, stages = config
                label = config_label(*config)
                if time.time() - t_start > args.budget_s:
                    return "(time)"
                row = dict(bs=rows, dtype=dtype_name(dtype), floor_us=floor, split=split, block=block,
                           warps=warps, prefetch=prefetch, stages=stages)  # fmt: skip
                try:
                    if part.startswith("read"):
                        rd = read_once_us(
                            bufs, split, block, warps, prefetch, stages, args.reps, part != "read"
                        )
                        t_read[(config, part)] = rd
                        rows_out.append(dict(table="sweep_" + part.replace(" + ", "_").replace(" ", "_"),
                                             read_us=rd, **row))  # fmt: skip
                        return f"{rd:.1f} ({rd / floor:.2f}×)"
                    st, want = states[part], wants[part]
                    k = RouteKernel(plan, "slm", "triton", DEVICE, split=split, block=block, warps=warps,
                                    sampler=args.sampler)  # fmt: skip
                    k._triton.options.prefetch, k._triton.options.stages = prefetch, stages
                    got = k(bufs[0], None, st)
                    bad = int(((got.token != want.token) | (got.rule != want.rule)).sum())
                    if bad:
                        out(f"# CHECK sweep {dtype_name(dtype)} {part} {label}: {bad} rows differ")
                    first = firsts.setdefault((part, block, warps, split), (label, got))
                    if not same_bits(first[1], got):  # prefetch and stages must not change a bit
                        out(f"# CHECK FAILED sweep {dtype_name(dtype)} {part}: {label} is not bit-identical to "
                            f"{first[0]}")  # fmt: skip
                    g = graph_time_us(lambda i: k(bufs[i], None, st), len(bufs), args.reps)
                except Exception as exc:  # a variant that does not compile or launch: say so, go on
                    out(f"# sweep {dtype_name(dtype)} {part} {label}: {type(exc).__name__}: {str(exc)[:300]}")
                    return "error"
                rd = t_read.get((config, "read"), float("nan"))
                rows_out.append(dict(table="sweep", temperature=SWEEP_TEMPS[part], fused_us=g, read_us=rd,
                                     mismatched_rows=bad, **row))  # fmt: skip
                return f"{g:.1f} ({g / floor:.2f}×, {g / rd:.2f}×)"

            for part in ("read", "greedy", "read + tile max", "sampled"):  # most wanted first
                cells = [sweep_cell(k, part) for k in configs]
                out(f"| {dtype_name(dtype)} | {mode_name(SWEEP_TEMPS[part]) if part in SWEEP_TEMPS else part} | "
                    + " | ".join(cells) + " |")  # fmt: skip
            out()
            del bufs
            dump()
    if args.stdlib:
        out(f"\n## Statistics the stdlib policies read, bs {rows}\n")
        out("| block | logits | rows | fused µs | d6f8f70 µs | floor µs | fused / floor |")
        out("|" + "---|" * 7)
        for label, ir in stdlib_irs().items():
            p = {"routes": {"slm": ir}, "routers": {}, "models": {}}
            k_new = RouteKernel(p, "slm", "triton", DEVICE, sampler=args.sampler)
            k_ref = RouteKernel(p, "slm", "torch", DEVICE, sampler=args.sampler)
            k_v1 = None if args.no_v1 else KernelV1(ir, DEVICE)
            for dtype in args.dtypes:
                if time.time() - t_start > args.budget_s:
                    out(f"| {label} | {dtype_name(dtype)} | (time) | | | | |")
                    continue
                bufs = buffers(rows, args.vocab, dtype)
                floor = rows * args.vocab * dtype.itemsize / (best_bw * 1e9) * 1e6
                for temp in (0.0, 0.8):
                    st = make_state(rows, temp)
                    x, y = k_ref(bufs[0], None, st), k_new(bufs[0], None, st)
                    bad = int(((x.token != y.token) | (x.rule != y.rule)).sum())
                    if bad:
                        out(
                            f"# CHECK {label} {dtype} {mode_name(temp)}: {bad} rows differ from the torch renderer"
                        )
                    g = graph_time_us(
                        lambda i, k=k_new, bufs=bufs, st=st: k(bufs[i], None, st), len(bufs), args.reps
                    )
                    g1 = float("nan")
                    if k_v1 is not None:
                        g1 = graph_time_us(
                            lambda i, k=k_v1, bufs=bufs, st=st: k(bufs[i], st), len(bufs), args.reps
                        )
                    rows_out.append(dict(table="stdlib", block_kind=label, bs=rows, dtype=dtype_name(dtype),
                                         temperature=temp, fused_us=g, v1_us=g1, floor_us=floor, mismatched_rows=bad))  # fmt: skip
                    out(f"| {label} | {dtype_name(dtype)} | {mode_name(temp)} | {g:.1f} | {g1:.1f} | "
                        f"{floor:.2f} | {g / floor:.2f}× |")  # fmt: skip
                del bufs
                dump()
    if args.tail_split:
        tail_split(args, out, plan, rows_out, best_bw, t_start)
    out(f"\n# {time.time() - t_start:.0f} s")
    dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
