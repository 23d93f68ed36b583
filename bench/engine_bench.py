"""Step latency of the embedded engine on one GPU, against the weight-read floor and HF transformers.

For each model shape (random bf16 weights filled on the GPU, the engine's dummy load) and context length:
- decode step latency at several batch sizes, with CUDA graphs and eager, against the floor of reading
  every weight once (weight bytes / the copy bandwidth measured in the same run, read + write counted);
- extend step latency (q new tokens per row on top of the context), with and without graphs, against a
  decode step of the same batch size;
- HF transformers eager (DynamicCache) on the same machine, fewer points;
- an ablation (Triton GEMV off; all fused ops off) and torch.profiler per-kernel tables of graph steps
  (`--profile-cases`, default decode bs 1 at ctx 4096 and extends bs 1 x q 2 / 8 at ctx 512; with
  --targets pass --profile);
- with --attention-sweep, the paged-attention kernel alone over its launch options;
- with --targets, only the issue's target points (decode bs 1/8/32/64, extend bs 1/4/16 x q 2/4/8, ctx
  512 and 4096, 0.6B and 8B; graphs for those shapes only; no HF, no eager) and an ablation of every
  switchable part of the fast path (`FAST_PATH_OPTIONS` in attention/triton_backend.py) side by side:
  each one off alone, and all parts added after the first measured engine off together ("before"), at the
  points they act on (the few-row GEMV `gemv_rows` at every step of 2-8 tokens: extends of bs 1, decodes of bs 4
  and 8, bs 4 x q 2); then the target verdicts. About 3-4 minutes on an H200.

A "step" is the model forward the engine runs per scheduler step: for graphs `CudaGraphRunner.replay`
(host-side input copies included), eagerly `init_forward_metadata` + `model(fb)`. Timing: `iters`
back-to-back steps, synchronised at the end, wall clock per step; the median of 3 such runs. An extend and
the decode it is divided by are timed in alternation (`time_pair`); `--passes P` times every point P times,
in passes over all points, and reports the pass with the median ratio (on the H200 passes agreed within 0.3 %).

The process's history matters: once a second set of graphs has been captured (the ablation's variants),
the engine's own graphs run 0.5-2.4 % faster (bs 1 extends) or 2-6 % slower (other steps) for the rest of the
process. The decode and extend tables come first, in the state a serving
subserver runs in (it captures once); the ablation's ratios compare two sides in the later state.

    python bench/engine_bench.py --shapes qwen3-0.6b,qwen3-8b --out out/engine_bench
    python bench/engine_bench.py --targets --out out/engine_bench
Prints markdown tables; writes engine_bench.json (+ profile-SHAPE.txt) under --out (rewritten after
every table, so a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from tokenrouter.runtime.engine.attention.triton_backend import (
    DOT_ROWS_NARROW_MAX,
    FAST_PATH_OPTIONS,
    GEMV_ROWS_MAX,
)
from tokenrouter.runtime.engine.config import EngineTuning, ModelConfig
from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner
from tokenrouter.runtime.engine.embedded import EmbeddedEngine, EngineConfig
from tokenrouter.runtime.engine.forward_batch import ForwardBatch
from tokenrouter.runtime.engine.make_model import config_dict, shape_for
from tokenrouter.runtime.engine.models import build_empty, init_dummy_weights


def save(args, results: dict) -> None:
    """Rewrite engine_bench.json under --out (after every table, so a run cut short keeps its figures)."""
    (Path(args.out) / "engine_bench.json").write_text(json.dumps(results, indent=1))


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def measure_copy_bandwidth(device: torch.device, gib: float = 2.0) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read and written."""
    n = int(gib * (1 << 30))
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / 5)
    del src, dst
    return 2 * n / best


def _calls_for(fn, target_s: float, sync) -> int:
    """How many back-to-back calls of `fn` take about `target_s` (5 to 200), from one timed call."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return int(min(200, max(5, target_s / max(time.perf_counter() - t0, 1e-5))))


def _per_call(fn, iters: int, sync) -> float:
    """Seconds per call of `fn` over `iters` calls back to back."""
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def time_step(fn, target_s: float = 0.15, reps: int = 3) -> float:
    """Seconds per call of `fn`, calls back to back (median of `reps` runs of an adaptive count)."""
    sync = torch.cuda.synchronize
    for _ in range(3):
        fn()
    iters = _calls_for(fn, target_s, sync)
    return statistics.median(_per_call(fn, iters, sync) for _ in range(reps))


def time_pair(fn_a, fn_b, target_s: float = 0.1, rounds: int = 4, sync=None) -> tuple[float, float]:
    """Seconds per call of `fn_a` and of `fn_b`, timed in alternation (A B B A A B B A ...: a slow drift of
    the GPU's clocks over the measurement falls on both alike); the median of `rounds` runs each. Ratios of
    two steps (extend / decode, an ablation's variant / default) come from here: on the H200, times of one
    step taken minutes apart in one process differed by up to 7 %. `sync`: torch.cuda.synchronize."""
    sync = sync or torch.cuda.synchronize
    for _ in range(3):
        fn_a()
        fn_b()
    iters = _calls_for(fn_a, target_s, sync)
    runs: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        order = ((0, fn_a), (1, fn_b)) if r % 2 == 0 else ((1, fn_b), (0, fn_a))
        for i, fn in order:
            runs[i].append(_per_call(fn, iters, sync))
    return statistics.median(runs[0]), statistics.median(runs[1])


def median_pass(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """Of (extend, decode) times from several passes, the pass whose ratio is the median one (the lower middle
    for an even count): a pair measured together, so the ratio it gives is one the run saw."""
    return sorted(runs, key=lambda gd: gd[0] / gd[1])[(len(runs) - 1) // 2]


def build_engine(
    name: str,
    max_tokens: int,
    max_batch: int,
    graphs: bool,
    graph_config: CudaGraphConfig | None = None,
    tuning: EngineTuning | None = None,
) -> EmbeddedEngine:
    """The engine on random weights; with `graph_config`, graphs for those shapes only."""
    config = ModelConfig.from_dict(config_dict(shape_for(name)), name)
    device = torch.device("cuda")
    model = build_empty(config, device, torch.bfloat16)
    init_dummy_weights(model, seed=0)
    settings = EngineConfig(
        device="cuda",
        dtype="bfloat16",
        max_tokens=max_tokens,
        max_batch=max_batch,
        max_reqs=max_batch,
        cuda_graph=graphs and graph_config is None,
        tuning=tuning or EngineTuning(),
    )
    engine = EmbeddedEngine(model, config, settings, name=name)
    if graphs and graph_config is not None:
        engine.graph_runner = CudaGraphRunner(engine, graph_config)
    return engine


class Contexts:
    """`rows` requests holding `ctx_max` KV slots each (written straight into the pools)."""

    def __init__(self, engine: EmbeddedEngine, rows: int, ctx_max: int) -> None:
        self.engine = engine
        self.req = []
        self.slots = []
        for _ in range(rows):
            r = engine.req_to_token_pool.alloc()
            s = engine.token_to_kv_pool.alloc(ctx_max)
            if r is None or s is None:
                raise SystemExit(f"pool too small for {rows} x {ctx_max} tokens")
            engine.req_to_token_pool.write(r, 0, s)
            self.req.append(r)
            self.slots.append(s)

    def batch(self, bs: int, ctx: int, q: int) -> ForwardBatch:
        """bs rows whose sequences end at `ctx` tokens, the last q of them new in this step."""
        e = self.engine
        gen = torch.Generator().manual_seed(bs * 1000 + q)
        ids = torch.randint(0, e.model_config.vocab_size, (bs * q,), generator=gen).tolist()
        return ForwardBatch.build(
            input_ids=ids,
            out_cache_loc=torch.cat([s[ctx - q : ctx] for s in self.slots[:bs]]),
            req_pool_indices=self.req[:bs],
            extend_prefix_lens=[ctx - q] * bs,
            extend_seq_lens=[q] * bs,
            device=e.device,
            req_to_token_pool=e.req_to_token_pool,
            token_to_kv_pool=e.token_to_kv_pool,
        )


def eager_step(engine: EmbeddedEngine, fb: ForwardBatch):
    def run():
        with torch.inference_mode():
            engine.attn_backend.init_forward_metadata(fb)
            return engine.model(fb)

    return run


def graph_step(runner: CudaGraphRunner, fb: ForwardBatch):
    def run():
        with torch.inference_mode():
            return runner.replay(fb)

    return run


def weight_bytes(engine: EmbeddedEngine) -> int:
    return sum(p.numel() * p.element_size() for p in engine.model.parameters())


def bench_shape(name: str, args, bandwidth: float, results: dict) -> None:
    ctx_max = max(args.ctx)
    rows = max(max(args.decode_bs), max(args.extend_bs))
    t0 = time.perf_counter()
    graph_config = None
    if args.targets:  # only the measured shapes; decode also at the extend sizes (the ratios' denominators)
        decode_sizes = tuple(sorted(set(args.decode_bs) | set(args.extend_bs)))
        graph_config = CudaGraphConfig(decode_sizes, tuple(args.extend_bs), tuple(args.extend_q))
    try:
        engine = build_engine(name, rows * ctx_max + 64, rows, graphs=True, graph_config=graph_config)
    except Exception as e:  # noqa: BLE001 — one retry without the launch mode this GPU stack may lack
        print(f"\n**{name}: building with graphs failed ({type(e).__name__}: {e}); retrying with pdl "
              f"off**", flush=True)  # fmt: skip
        results.setdefault("fallbacks", []).append(dict(shape=name, error=f"{type(e).__name__}: {e}"))
        torch.cuda.empty_cache()
        no_pdl = EngineTuning(pdl=False)
        engine = build_engine(name, rows * ctx_max + 64, rows, True, graph_config, no_pdl)
    runner = engine.graph_runner
    setup_s = time.perf_counter() - t0
    wbytes = weight_bytes(engine)
    floor_ms = wbytes / bandwidth * 1e3
    info = {
        "weight_bytes": wbytes,
        "floor_ms": floor_ms,
        "setup_s": setup_s,
        "capture_s": runner.capture_seconds,
        "options": switch_states(engine.attn_backend),
        "gemv_rows_max": engine.attn_backend.gemv_rows_max,
        "gemv_rows_batch_max": engine.attn_backend.gemv_rows_batch_max,
    }
    results["shapes"][name] = info
    print(f"\n### {name}: {wbytes / 1e9:.2f} GB of weights, floor {floor_ms:.3f} ms; "
          f"built in {setup_s:.1f} s (graph capture {runner.capture_seconds:.1f} s, "
          f"{len(runner.graphs)} graphs)\n", flush=True)  # fmt: skip
    ctxs = Contexts(engine, rows, ctx_max)
    decode: dict[tuple[int, int], float] = {}

    print("| ctx | bs | decode, graphs (ms) | decode, eager (ms) | graphs / floor |")
    print("| --- | --- | --- | --- | --- |")
    for ctx in args.ctx:
        for bs in args.decode_bs:
            fb = ctxs.batch(bs, ctx, 1)
            g = time_step(graph_step(runner, fb)) * 1e3
            e = time_step(eager_step(engine, fb)) * 1e3 if not args.no_eager else float("nan")
            decode[(ctx, bs)] = g
            results["decode"].append(
                dict(shape=name, ctx=ctx, bs=bs, graph_ms=g, eager_ms=e, floor_ms=floor_ms)
            )
            print(f"| {ctx} | {bs} | {g:.3f} | {e:.3f} | {g / floor_ms:.2f} |", flush=True)
    save(args, results)

    passes = " (median of the passes' ratios) | ratio, each pass" if args.passes > 1 else ""
    print("\n| ctx | bs | new tokens / row | extend, graphs (ms) | extend, eager (ms) | decode, graphs (ms; "
          f"timed in alternation with the extend) | extend / decode (graphs){passes} |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if passes else ""))
    points = [(ctx, bs, q) for ctx in args.ctx for bs in args.extend_bs for q in args.extend_q]
    timed: dict[tuple, list[tuple[float, float]]] = {pt: [] for pt in points}
    eager: dict[tuple, float] = {}
    for k in range(args.passes):  # each pass over every point: a point's ratio at P moments of the run
        for pt in points:
            ctx, bs, q = pt
            fb = ctxs.batch(bs, ctx, q)
            shape = runner.shape_for(fb)
            # the decode of the same bs in alternation with the extend: the ratio's two sides, same minute
            if shape:
                pair = time_pair(graph_step(runner, fb), graph_step(runner, ctxs.batch(bs, ctx, 1)))
                timed[pt].append((pair[0] * 1e3, pair[1] * 1e3))
            else:
                timed[pt].append((float("nan"), decode.get((ctx, bs), float("nan"))))
            if k == 0:
                eager[pt] = time_step(eager_step(engine, fb)) * 1e3 if not args.targets else float("nan")
            if k < args.passes - 1:
                continue
            g, dec = median_pass(timed[pt])
            each = [gd[0] / gd[1] for gd in timed[pt]]
            results["extend"].append(
                dict(shape=name, ctx=ctx, bs=bs, q=q, graph_ms=g, eager_ms=eager[pt], decode_graph_ms=dec,
                     graph_shape=shape, pass_ratios=each)
            )  # fmt: skip
            cell = f" {' / '.join(f'{r:.3f}' for r in each)} |" if passes else ""
            print(f"| {ctx} | {bs} | {q} | {g:.3f} | {eager[pt]:.3f} | {dec:.3f} | {g / dec:.2f} |{cell}",
                  flush=True)  # fmt: skip
    save(args, results)

    if args.ablation:  # --no-ablation skips either
        (target_ablation if args.targets else ablation)(engine, ctxs, args, results, name)
    if args.profile:
        profile(runner, ctxs, args, name)
    del runner, engine, ctxs
    torch.cuda.empty_cache()


def ablation(engine: EmbeddedEngine, ctxs: Contexts, args, results: dict, name: str) -> None:
    """Decode with graphs: the default fast path against the same forward without the Triton GEMV
    (cuBLAS for every linear; the GEMV only serves one-row steps) and without any fused op (the
    model's plain forward)."""
    ctx = min(args.ctx)
    sizes = tuple(b for b in (1, 8) if b <= engine.max_batch)
    print(f"\nAblation, {name} (decode, graphs, ctx {ctx}):\n")
    print("| bs | default (ms) | no GEMV (ms) | no fused ops (ms) |")
    print("| --- | --- | --- | --- |")
    backend = engine.attn_backend
    times = {bs: [time_step(graph_step(engine.graph_runner, ctxs.batch(bs, ctx, 1))) * 1e3] for bs in sizes}
    for fused, small in ((True, False), (False, False)):
        backend.fused_ops, backend.gemv = fused, small
        try:
            runner = CudaGraphRunner(engine, CudaGraphConfig(sizes, (), ()))
            for bs in sizes:
                times[bs].append(time_step(graph_step(runner, ctxs.batch(bs, ctx, 1))) * 1e3)
            del runner
        finally:
            backend.fused_ops, backend.gemv = True, True
    for bs in sizes:
        d, g, u = times[bs]
        results["ablation"].append(dict(shape=name, ctx=ctx, bs=bs, default_ms=d, no_gemv_ms=g, unfused_ms=u))
        print(f"| {bs} | {d:.3f} | {g:.3f} | {u:.3f} |", flush=True)


# The one-token parts added after the first measured engine, timed at decode bs 1;
# "before" turns all of them and `gemv_rows` (timed where it acts, see `ablation_plan`) off.
NEW_SINCE_AB = (  # most telling first: rows past --ablation-budget-s are skipped
    "pdl",
    "gemv_norm",
    "attn_prefetch",
)

# What an ablation row may turn off: the fast path's parts and the on/off fields of `EngineTuning` (the
# backend keeps them as attributes of the same names)
SWITCHES = (*FAST_PATH_OPTIONS, "tuned_tiles", "pdl")


def switch_states(backend) -> dict[str, bool]:
    """The state of each of SWITCHES (for the results' record)."""
    return {name: getattr(backend, name) for name in SWITCHES}


# Backend sizes an ablation row may set ("gemv_rows_max=2"): the steps each kernel takes
SETTINGS = {
    "gemv_rows_max",
    "gemv_rows_batch_max",
    "dot_rows_max",
    "dot_rows_decode_max",
    "dot_rows_norm_max",
    "fused_merge_rows",
    "fused_merge_passes",
    "attn_decode_single_stage_bs",
    "attn_extend_single_stage_rows",
    "attn_prefetch_max",
    "attn_wide_tile_splits",
    "attn_narrow_tile_splits",
    "attn_split_rows",
}

# The parts added for the two targets still missed after the gemv_rows run (0.6B bs 1 decode at ctx 4096,
# 0.6B bs 1 extends): timed first, each where it acts (see `ablation_plan`).
NEW_AFTER_GEMV_ROWS = ("fused_merge",)


def ablation_plan(
    ctxs: list[int],
    extend_bs: list[int],
    extend_q: list[int],
    decode_bs: list[int] = (),
    gemv_rows_max: int = GEMV_ROWS_MAX,
    gemv_rows_batch_max: int = GEMV_ROWS_MAX,
    dot_rows_max: int = 0,
    dot_rows_decode_max: int | None = None,
    dot_rows_norm_max: int = 0,
) -> list[tuple[str, tuple, list]]:
    """(label, options off, points) for the target ablation, most telling first; a point is (ctx, bs, q).
    Each part is timed where it acts: first the newest parts (`NEW_AFTER_GEMV_ROWS`): the merge fused
    into attention at decode bs 1 and the smallest bs 1 extend, the final norm of the last tokens at the
    bs 1 extends; then the one-token parts and the split cap at decode bs 1, the few-row GEMV
    (`gemv_rows`) at every measured step of 2 to `gemv_rows_max` tokens of at most `gemv_rows_batch_max`
    requests (decodes of `decode_bs`, extends), the attention stage choice at the largest extend (32-row
    blocks), the attention's KV tiles there and at the bs 1 extends. With `dot_rows_max` (0: the model is
    too large for it, or it is off; decodes up to `dot_rows_decode_max` rows, None: the same), the tensor-core
    few-row kernel's 17-32 token steps on cuBLAS (`dot_rows_max=16`, where it takes them: by default with
    tuned 32-row tiles, or `EngineTuning.dot_rows_max` 32)
    first, then its tiles tuned in the graph (`tuned_tiles`) and the kernel itself (`dot_rows`), at every
    measured step of 2 to `dot_rows_max` tokens that `gemv_rows` does not take, then its weight prefetch off
    (`dot_prefetch`), then its folded add & RMSNorm off at
    the steps of up to `dot_rows_norm_max` tokens, where the tuned tables fold it (`dot_rows_norm_max=0`);
    then the 3-4 token steps on the few-row GEMV (`gemv_rows_max=4`; on dot_rows with
    `gemv_rows_max=2` when the GEMV takes them) and the GEMV's 2-token steps on dot_rows (`gemv_rows_max=1`)."""
    decode = [(ctx, 1, 1) for ctx in ctxs]
    steps = {(bs, 1) for bs in decode_bs} | {(bs, q) for bs in extend_bs for q in extend_q}
    few_rows = [
        (ctx, bs, q)
        for ctx in ctxs
        for bs, q in sorted(steps)
        if 2 <= bs * q <= gemv_rows_max and bs <= gemv_rows_batch_max
    ]
    bs1_extends = [(ctx, 1, q) for ctx in ctxs for q in sorted(extend_q) if 1 in extend_bs]
    decode_max = dot_rows_max if dot_rows_decode_max is None else dot_rows_decode_max
    dot_rows = [
        (ctx, bs, q)
        for ctx in ctxs
        for bs, q in sorted(steps)
        if 2 <= bs * q <= (dot_rows_max if q > 1 else decode_max) and (ctx, bs, q) not in few_rows
    ]
    plan = []
    if dot_rows:  # its tiles tuned in the graph, weight prefetch and folded add & RMSNorm where it runs
        narrow = DOT_ROWS_NARROW_MAX  # the 32-row block's steps, on cuBLAS before
        wide_dot = [p for p in dot_rows if p[1] * p[2] > narrow]
        if wide_dot:
            row = (
                f"dot_rows_max={narrow} (17-32 token steps on cuBLAS)",
                (f"dot_rows_max={narrow}",),
                wide_dot,
            )
            plan.append(row)
        # the decode bs 1 too: its one-token GEMV's tiles are tuned as well
        one = [(ctx, 1, 1) for ctx in ctxs if 1 in decode_bs]
        tuned = one + dot_rows
        plan.append(("no tuned_tiles (the autotuner's dot_rows and GEMV tiles)", ("tuned_tiles",), tuned))
        plan.append(("no dot_rows", ("dot_rows",), dot_rows))
        plan.append(("no dot_prefetch", ("dot_prefetch",), dot_rows))
        folded = [p for p in dot_rows if p[1] * p[2] <= dot_rows_norm_max]  # the tables' folded row blocks
        if folded:
            plan.append(("dot_rows_norm_max=0 (no folded norm)", ("dot_rows_norm_max=0",), folded))
        # the 3-4 token steps (the few-row GEMV's earlier reach) on the kernel that does not take them now
        wider = [(ctx, bs, q) for ctx in ctxs for bs, q in sorted(steps) if 3 <= bs * q <= 4 and bs <= 4]
        if wider and gemv_rows_max >= 4:
            plan.append(("gemv_rows_max=2 (3-4 token steps on dot_rows)", ("gemv_rows_max=2",), wider))
        elif wider:
            row = ("gemv_rows_max=4", "gemv_rows_batch_max=4")
            plan.append(("gemv_rows_max=4 (3-4 token steps on gemv_rows)", row, wider))
        twos = [p for p in few_rows if p[1] * p[2] == 2]  # the GEMV's 2-token steps, on dot_rows
        if twos:
            plan.append(("gemv_rows_max=1 (2-token steps on dot_rows)", ("gemv_rows_max=1",), twos))
    plan.append(
        ("no fused_merge", ("fused_merge",), decode + [p for p in bs1_extends if p[2] == min(extend_q)])
    )
    before = (*NEW_AFTER_GEMV_ROWS, *NEW_SINCE_AB, "gemv_rows")
    plan.append(("before (" + ", ".join(before) + " off)", before, decode))
    if few_rows:
        plan.append(("no gemv_rows", ("gemv_rows",), few_rows))
    if extend_bs and extend_q:
        plan.append(
            ("no attn_stages", ("attn_stages",), [(ctx, max(extend_bs), max(extend_q)) for ctx in ctxs])
        )
        # the KV tiles: wide at the largest extend, narrow at the one-request extends
        tiles = [(ctx, max(extend_bs), max(extend_q)) for ctx in ctxs] + bs1_extends
        plan.append(("no attn_tiles", ("attn_tiles",), tiles))
    plan += [(f"no {o}", (o,), decode) for o in NEW_SINCE_AB]
    for _, off, _ in plan:
        if unknown := unknown_names(off):
            raise ValueError(f"ablation names unknown options {unknown}")
    return plan


def unknown_names(names) -> set[str]:
    """The entries of an ablation row's names that are neither one of SWITCHES nor a size setting with an
    integer value (SIZE=N)."""
    unknown = {n for n in names if "=" not in n} - set(SWITCHES)
    for name in (n for n in names if "=" in n):
        size, _, value = name.partition("=")
        if size not in SETTINGS or not value.isdigit():
            unknown.add(name)
    return unknown


def named_ablation(names: str, ctxs, extend_bs, extend_q, decode_bs) -> list[tuple[str, tuple, list]]:
    """--ablate "a,b=2,c+d=3": one row per entry (a part off or a size set; "+" joins
    changes made together in one row), each at every measured step (the decodes of --decode-bs, then the
    extends), instead of `ablation_plan`'s rows."""
    points = [(ctx, bs, 1) for ctx in ctxs for bs in decode_bs]
    points += [(ctx, bs, q) for ctx in ctxs for bs in extend_bs for q in extend_q]
    plan = []
    for entry in filter(None, (n.strip() for n in names.split(","))):
        row = tuple(n.strip() for n in entry.split("+"))
        if bad := unknown_names(row) | ({""} & set(row)):
            raise SystemExit(f"--ablate: {', '.join(map(repr, sorted(bad)))} in {entry!r}: not a fast-path part "
                             f"or SIZE=N ({', '.join(sorted(SETTINGS))})")  # fmt: skip
        label = " + ".join(n if "=" in n else f"no {n}" for n in row)
        plan.append((label, row, points))
    return plan


def settings(names) -> dict[str, int]:
    """The "attribute=value" entries of an ablation row's names, as {attribute: int value}."""
    return {k: int(v) for k, _, v in (n.partition("=") for n in names if "=" in n)}


def parts(names) -> dict:
    """An ablation row's record of what it changed: parts_off (and settings, the backend sizes it set)."""
    off = [n for n in names if "=" not in n]
    extra = {"settings": settings(names)} if settings(names) else {}
    return dict(parts_off=off, **extra)


def target_ablation(engine: EmbeddedEngine, ctxs: Contexts, args, results: dict, name: str) -> None:
    """Each planned variant: the options off, graphs captured again for its points' shapes
    only, each point timed in alternation with the default (the main runner)."""
    backend = engine.attn_backend

    def set_options(state: dict) -> None:
        for o, v in state.items():
            setattr(backend, o, v)

    def in_state(state: dict, fn):
        """`fn` run with the backend's options set to `state` first."""

        def run():
            set_options(state)
            return fn()

        return run

    print(f"\nAblation, {name} (CUDA graphs; each row: the default vs the same step with parts off or "
          f"sizes set), ms:\n")  # fmt: skip
    print("| parts off | ctx | bs | q | default | parts off | off / default | max logit diff / max logit |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    started = time.perf_counter()
    decode_bs = sorted(set(args.decode_bs) | set(args.extend_bs))  # the main runner's decode graphs
    small = backend.small_hidden_max is None or engine.model_config.hidden_size <= backend.small_hidden_max
    plan = ablation_plan(
        args.ctx,
        args.extend_bs,
        args.extend_q,
        decode_bs,
        backend.gemv_rows_max,
        backend.gemv_rows_batch_max,
        backend.dot_rows_max if backend.dot_rows and small else 0,
        backend.dot_rows_decode_max,
        backend.dot_rows_norm_max,
    )
    if args.ablate:
        plan = named_ablation(args.ablate, args.ctx, args.extend_bs, args.extend_q, args.decode_bs)
    for label, off, points in plan:
        if time.perf_counter() - started > args.ablation_budget_s:
            print(f"| {label} | skipped: past --ablation-budget-s {args.ablation_budget_s:g} | | | | | | |")
            continue
        saved = switch_states(backend) | {k: getattr(backend, k) for k in SETTINGS}
        sizes = settings(off)
        switches = [o for o in off if "=" not in o]
        default_state = {o: saved[o] for o in (*switches, *sizes)}
        # a switch off, a size set
        variant_state = dict.fromkeys(switches, False) | sizes
        set_options(variant_state)
        try:
            shapes = sorted({(bs, q) for _, bs, q in points})
            runner = CudaGraphRunner(
                engine,
                CudaGraphConfig(
                    tuple(bs for bs, q in shapes if q == 1),
                    tuple(bs for bs, q in shapes if q > 1),
                    tuple(sorted({q for _, q in shapes if q > 1})),
                ),
            )
            timed, diffs = {}, {}
            for pt in points:
                fb = ctxs.batch(pt[1], pt[0], pt[2])
                # default and variant in alternation (`time_pair`), each side with its own option state
                timed[pt] = time_pair(
                    in_state(default_state, graph_step(engine.graph_runner, fb)),
                    in_state(variant_state, graph_step(runner, fb)),
                )
                # a check that the variants compute the same step: the default and the variant back to back,
                # so both read the same KV. A step writes the K/V of its own q new positions only; the ones
                # before them hold what the last step that had them as new tokens wrote (a larger q, another
                # bs: other token ids), so logits taken minutes apart differ for that alone (measured: 0.3-1.4
                # x the largest logit at q 2 and 4, rounding at q 8, the largest q).
                with torch.inference_mode():
                    set_options(default_state)
                    ref = engine.graph_runner.replay(fb)[0].float()
                    set_options(variant_state)
                    var = runner.replay(fb)[0].float()
                diffs[pt] = ((ref - var).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
            del runner
        except Exception as e:  # noqa: BLE001 — report the variant and go on with the others
            print(f"| {label} | failed: {type(e).__name__}: {str(e)[:200]} | | | | | | |", flush=True)
            results["ablation"].append(dict(shape=name, **parts(off), error=f"{type(e).__name__}: {e}"))
            continue
        finally:
            for o, on in saved.items():
                setattr(backend, o, on)
        for pt in points:
            diff = diffs[pt]
            ctx, bs, q = pt
            d, o = (x * 1e3 for x in timed[pt])
            results["ablation"].append(
                dict(shape=name, **parts(off), ctx=ctx, bs=bs, q=q, default_ms=d, off_ms=o,
                     max_logit_diff=diff)
            )  # fmt: skip
            print(
                f"| {label} | {ctx} | {bs} | {q} | {d:.3f} | {o:.3f} | {o / d:.3f} | {diff:.3g} |", flush=True
            )
        save(args, results)
        torch.cuda.empty_cache()


def target_verdicts(results: dict) -> list[dict]:
    """The issue's three targets from the measured rows: 0.6B bs 1 decode <= 1.0 ms; 8B bs 1 decode
    <= 1.25 x floor; extend <= 1.3 x decode of the same bs (graphs), and that one again with the
    `gemv_rows` ablation's times where it has them (gemv_rows off), and where it has them for bs > 1
    (gemv_rows for one-request steps only, `gemv_rows_batch_max` = 1)."""
    out = []
    for row in results["decode"]:
        if row["bs"] != 1:
            continue
        if row["shape"] == "qwen3-0.6b":
            out.append(dict(target="0.6B bs 1 decode <= 1.0 ms", ctx=row["ctx"], value=row["graph_ms"],
                            limit=1.0, met=row["graph_ms"] <= 1.0))  # fmt: skip
        elif row["shape"] == "qwen3-8b":
            ratio = row["graph_ms"] / row["floor_ms"]
            out.append(dict(target="8B bs 1 decode <= 1.25 x floor", ctx=row["ctx"], value=ratio, limit=1.25,
                            met=ratio <= 1.25))  # fmt: skip
    ext = [r for r in results["extend"] if r["graph_ms"] == r["graph_ms"]]  # not NaN
    if ext:
        out.append(_extend_verdict("extend <= 1.3 x decode (worst point)", ext, {}))
        # the same with the few-row GEMV off: its ablation rows replace the steps it acts on (decodes
        # and extends of 2-8 tokens), so one run shows the target both ways
        off = {(r["shape"], r["ctx"], r["bs"], r["q"]): r["off_ms"] for r in results.get("ablation", [])
               if r.get("parts_off") == ["gemv_rows"] and "off_ms" in r}  # fmt: skip
        if off:
            out.append(_extend_verdict("extend <= 1.3 x decode, gemv_rows off (its ablation rows)", ext, off))
            # and with it on for one request only (gemv_rows_batch_max = 1): off where bs > 1
            off_bs = {k: ms for k, ms in off.items() if k[2] > 1}
            out.append(_extend_verdict("extend <= 1.3 x decode, gemv_rows at bs 1 only", ext, off_bs))
    return out


def _extend_verdict(target: str, ext: list[dict], replaced: dict) -> dict:
    """The worst extend / decode ratio over `ext`, with the times of `replaced` ((shape, ctx, bs, q) ->
    ms; q 1: the decode) in place of the measured ones where given."""

    def ratio(r: dict) -> float:
        e = replaced.get((r["shape"], r["ctx"], r["bs"], r["q"]), r["graph_ms"])
        return e / replaced.get((r["shape"], r["ctx"], r["bs"], 1), r["decode_graph_ms"])

    worst = max(ext, key=ratio)
    over = sum(1 for r in ext if ratio(r) > 1.3)
    return dict(target=target, ctx=worst["ctx"], value=ratio(worst), limit=1.3, met=over == 0,
                point=f"{worst['shape']} bs {worst['bs']} q {worst['q']}", points_over=over,
                points=len(ext))  # fmt: skip


def attention_sweep(args, results: dict) -> None:
    """The paged-attention kernel alone, bs 16 x ctx 4096, over its launch options."""
    from tokenrouter.runtime.engine.kernels import attention as ka

    bs, ctx, dim = 16, 4096, 128
    print(f"\nPaged attention kernel alone, bs {bs}, ctx {ctx}, head_dim {dim}, bf16 (us per call):\n")
    print("| heads / kv | new tokens | block_m | warps | stages | us | KV GB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    dev = torch.device("cuda")
    slots = bs * ctx + 1
    kv_bytes = 2 * bs * ctx * 8 * dim * 2
    k_buf = torch.randn(slots, 8, dim, device=dev, dtype=torch.bfloat16)
    v_buf = torch.randn_like(k_buf)
    table = torch.zeros(bs + 1, ctx, dtype=torch.int32, device=dev)
    table[1:] = torch.randperm(slots - 1, device=dev).view(bs, ctx).to(torch.int32) + 1
    req = torch.arange(1, bs + 1, device=dev)
    seq = torch.full((bs,), ctx, device=dev)
    for heads, q_len in ((32, 1), (32, 8), (16, 8)):
        q = torch.randn(bs * q_len, heads, dim, device=dev, dtype=torch.bfloat16)
        out = torch.empty_like(q)
        starts = torch.arange(bs, device=dev) * q_len
        ext = torch.full((bs,), q_len, device=dev)
        rows = q_len * heads // 8
        for block_m in [m for m in (16, 32, 64) if m <= max(16, rows)]:
            for warps in (4, 8):
                for stages in (1, 2, 3):
                    call = functools.partial(
                        ka.paged_attention, q, k_buf, v_buf, out, table, req, seq, starts, ext, q_len,
                        dim**-0.5, block_m=block_m, num_warps=warps, num_stages=stages,
                    )  # fmt: skip
                    us = time_step(call, target_s=0.05) * 1e6
                    results["attention"].append(dict(heads=heads, q=q_len, block_m=block_m, warps=warps,
                                                     stages=stages, us=us))  # fmt: skip
                    print(f"| {heads}/8 | {q_len} | {block_m} | {warps} | {stages} | {us:.1f} | "
                          f"{kv_bytes / us / 1e3:.0f} |", flush=True)  # fmt: skip
    del k_buf, v_buf
    torch.cuda.empty_cache()


def parse_steps(text: str, flag: str, min_q: int = 1, max_tokens: int | None = None) -> list[tuple[int, int]]:
    """Steps written "4x1,1x8" (the bench scripts' --steps, --objective, --points): (requests, new tokens each)
    per step, q 1 a decode; each at least `min_q` new tokens a request and `max_tokens` in all. A bad item
    exits naming `flag` and what was expected."""
    limit = f", at most {max_tokens} tokens" if max_tokens else ""
    need = f"BSxQ (requests x new tokens, q >= {min_q}{limit})"
    steps = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        bs, sep, q = item.lower().partition("x")
        ok = sep and bs.isdigit() and q.isdigit() and int(bs) >= 1 and int(q) >= min_q
        if not ok or (max_tokens is not None and int(bs) * int(q) > max_tokens):
            raise SystemExit(f"{flag}: {item!r} is not {need}")
        steps.append((int(bs), int(q)))
    if not steps:
        raise SystemExit(f"{flag}: give at least one {need}")
    return steps


def profile_cases(text: str) -> list[tuple[int, int, int]]:
    """--profile-cases "BSxQ@CTX,...": (bs, q, ctx) per case; q 1 is a decode."""
    cases = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        shape, sep, ctx = item.partition("@")
        if not (sep and ctx.strip().isdigit()):
            raise SystemExit(f"--profile-cases: {item!r} is not BSxQ@CTX (e.g. 1x2@512)")
        ((bs, q),) = parse_steps(shape, f"--profile-cases {item!r}")
        cases.append((bs, q, int(ctx)))
    return cases


def profile(runner: CudaGraphRunner, ctxs: Contexts, args, name: str) -> None:
    """torch.profiler over 20 graph replays of each --profile-cases step: per-kernel device time (the
    table) and kernel launches per step, so decode and extend steps can be compared op by op."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    texts = []
    for bs, q, ctx in args.profile_cases:
        if ctx > max(args.ctx) or bs > len(ctxs.req):
            print(f"\n(profile {name} bs {bs} q {q} ctx {ctx}: outside the contexts held, skipped)")
            continue
        fb = ctxs.batch(bs, ctx, q)
        if runner.shape_for(fb) is None:
            print(f"\n(profile {name} bs {bs} q {q} ctx {ctx}: no graph of that shape, skipped)")
            continue
        step = graph_step(runner, fb)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        reps = 20
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                step()
            torch.cuda.synchronize()
        events = prof.key_averages()
        kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
        launches = sum(e.count for e in kernels) / reps
        device_us = sum(getattr(e, "self_device_time_total", 0.0) for e in kernels) / reps
        try:
            table = events.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=60)
        except Exception:  # older torch names the key self_cuda_time_total
            table = events.table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=60)
        kind = "decode" if q == 1 else f"extend q={q}"
        text = (
            f"{name}: torch.profiler, {reps} graph replays, {kind} bs={bs} ctx={ctx}: "
            f"{launches:.0f} kernels and {device_us:.0f} us of kernel time per step\n{table}"
        )
        print("\n```\n" + text + "\n```", flush=True)
        texts.append(text)
    if args.out and texts:
        (Path(args.out) / f"profile-{name}.txt").write_text("\n\n".join(texts))


def kernel_resources() -> list[dict]:
    """Registers and spills of every compiled variant of the engine's Triton kernels (a kernel that spills
    on this GPU's Triton is a lead on where time goes; ptxas may spill differently across versions)."""
    import triton

    from tokenrouter.runtime.engine.kernels import attention, dot_rows, elementwise, linear

    out = []
    jitted = [fn for module in (attention, elementwise, linear, dot_rows) for fn in vars(module).values()]
    for fn in jitted:
        if not isinstance(fn, triton.runtime.JITFunction):
            continue
        for cache in getattr(fn, "device_caches", {}).values():
            kernels = cache[0] if isinstance(cache, tuple) else cache
            for key, k in kernels.items():
                try:
                    md = k.metadata
                    out.append(dict(kernel=fn.__name__, regs=k.n_regs, spills=k.n_spills, warps=md.num_warps,
                                    stages=md.num_stages, key=str(key)[:300]))  # fmt: skip
                except Exception as e:  # noqa: BLE001 — a diagnostic: report and go on
                    out.append(dict(kernel=fn.__name__, error=f"{type(e).__name__}: {e}"))
    return out


def print_kernel_resources(results: dict) -> None:
    rows = kernel_resources()
    results["kernel_resources"] = rows
    print("\n### Triton kernels compiled in this run: registers and spills\n")
    print("| kernel | variants | max registers | variants that spill | most spilled (bytes) |")
    print("| --- | --- | --- | --- | --- |")
    for name in sorted({r["kernel"] for r in rows}):
        mine = [r for r in rows if r["kernel"] == name and "regs" in r]
        if not mine:
            continue
        spill = [r for r in mine if r["spills"]]
        print(f"| {name} | {len(mine)} | {max(r['regs'] for r in mine)} | {len(spill)} | "
              f"{max((r['spills'] for r in spill), default=0)} |")  # fmt: skip
    for r in sorted((r for r in rows if r.get("spills")), key=lambda r: -r["spills"])[:8]:
        print(f"- spills {r['spills']} B, {r['regs']} regs, {r['warps']} warps, {r['stages']} stages: "
              f"{r['kernel']} {r['key'][:200]}")  # fmt: skip


def bench_hf(name: str, args, results: dict) -> None:
    """HF transformers eager, DynamicCache: decode and one extend size, at the smallest context."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    raw = config_dict(shape_for(name))
    cfg = Qwen3Config(
        **{k: v for k, v in raw.items() if k not in ("architectures", "torch_dtype", "model_type")}
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    ctx = min(args.ctx)
    print(f"\nHF transformers {name}, eager, DynamicCache, ctx {ctx}:\n")
    print("| bs | new tokens / row | step (ms) |")
    print("| --- | --- | --- |")
    for bs in args.hf_bs:
        for q in (1, max(args.extend_q)):
            with torch.inference_mode():
                prompt = torch.randint(0, cfg.vocab_size, (bs, ctx - q), device="cuda")
                out = model(prompt, use_cache=True)
                cache = out.past_key_values
                new = torch.randint(0, cfg.vocab_size, (bs, q), device="cuda")
                length = cache.get_seq_length()

                def step(cache=cache, new=new, length=length, model=model):
                    extra = cache.get_seq_length() - length
                    if extra > 0:  # drop the tokens the last timed step appended
                        cache.crop(-extra)  # a negative count removes tokens in every version
                    return model(new, past_key_values=cache, use_cache=True).logits

                ms = time_step(step, target_s=0.3, reps=2) * 1e3
            results["hf"].append(dict(shape=name, ctx=ctx, bs=bs, q=q, ms=ms))
            print(f"| {bs} | {q} | {ms:.3f} |", flush=True)
            del cache, out
    del model
    torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="qwen3-0.6b,qwen3-8b")
    p.add_argument("--ctx", type=ints, default=[512, 4096])
    p.add_argument("--decode-bs", type=ints, default=[1, 8, 32, 64])
    p.add_argument("--extend-bs", type=ints, default=[1, 4, 16])
    p.add_argument("--extend-q", type=ints, default=[2, 4, 8])
    p.add_argument("--hf-bs", type=ints, default=[1, 8])
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--no-eager", action="store_true", help="skip eager decode (extend eager is kept)")
    p.add_argument("--ablation", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: on, off with --targets",
    )
    p.add_argument(
        "--profile-cases",
        type=profile_cases,
        default=profile_cases("1x1@4096,1x2@512,1x8@512"),
        help="steps to profile, BSxQ@CTX (q 1: decode); default: decode bs 1 ctx 4096, extend bs 1 q 2 and 8 at 512",
    )
    p.add_argument("--attention-sweep", action="store_true", help="time the attention kernel's options")
    p.add_argument(
        "--targets",
        action="store_true",
        help="the issue's target points only, with the fast-path ablation (see the module doc)",
    )
    p.add_argument(
        "--ablation-budget-s",
        type=float,
        default=75.0,
        help="--targets: seconds per shape for the ablation; later rows are skipped (listed as skipped)",
    )
    p.add_argument(
        "--ablate",
        default="",
        help="--targets: instead of the planned ablation, these parts off (or SIZE=N set), "
        "comma-separated, each at every measured step (e.g. pdl,dot_prefetch,attn_prefetch)",
    )
    p.add_argument(
        "--passes",
        type=int,
        default=1,
        help="time every extend point (with its decode in alternation) this many times, in passes over all "
        "points; each point reports the pass with the median ratio, and every pass's ratio",
    )
    p.add_argument("--out", default="out/engine_bench")
    args = p.parse_args(argv)
    if args.targets:  # the target points; --shapes/--ctx/... given explicitly still narrow them
        args.no_hf = args.no_eager = True
        if args.profile is None:
            args.profile = False
    elif args.profile is None:
        args.profile = True
    if args.passes < 1:
        p.error(f"--passes {args.passes}: expected at least 1")
    if not torch.cuda.is_available():
        print("engine_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    Path(args.out).mkdir(parents=True, exist_ok=True)
    import triton

    device = torch.device("cuda")
    bandwidth = measure_copy_bandwidth(device)
    from tokenrouter.runtime.engine.kernels import common as kc

    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               python=platform.python_version(), copy_bandwidth_Bps=bandwidth, argv=sys.argv[1:],
               pdl_supported=kc.PDL_SUPPORTED)  # fmt: skip
    results: dict = {
        "env": env,
        "shapes": {},
        "decode": [],
        "extend": [],
        "hf": [],
        "ablation": [],
        "attention": [],
    }
    print(f"## Engine step latency on {env['gpu']} (torch {env['torch']}, triton {env['triton']})\n")
    print(
        f"Copy bandwidth (read + write): {bandwidth / 1e12:.2f} TB/s; Triton PDL supported: {kc.PDL_SUPPORTED}"
    )
    if args.attention_sweep:
        attention_sweep(args, results)
    names = [s for s in args.shapes.split(",") if s]
    started = time.perf_counter()
    for name in names:
        bench_shape(name, args, bandwidth, results)
        save(args, results)
        print(f"\n({name} done, {time.perf_counter() - started:.0f} s since the start)", flush=True)
    if not args.no_hf:
        for name in names[:2]:
            bench_hf(name, args, results)
            save(args, results)
    try:
        print_kernel_resources(results)
        save(args, results)
    except Exception as e:  # noqa: BLE001 — a diagnostic only
        print(f"\n(kernel resources not read: {type(e).__name__}: {e})")
    if args.targets:
        results["targets"] = target_verdicts(results)
        save(args, results)
        print(
            "\n### Targets\n\n| target | ctx | measured | limit | met | |\n| --- | --- | --- | --- | --- | --- |"
        )
        for t in results["targets"]:
            extra = f"{t['point']}; {t['points_over']} of {t['points']} points over" if "point" in t else ""
            print(f"| {t['target']} | {t['ctx']} | {t['value']:.3f} | {t['limit']} | {t['met']} | {extra} |")
    print(f"\nTotal {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
