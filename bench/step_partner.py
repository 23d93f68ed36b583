"""Whether an engine step's measured time depends on what it is timed beside, or on the process's history.

`engine_bench.py --targets` times each extend graph in alternation with the decode of the same batch size
(`time_pair`: blocks of about 0.1 s, A B B A ...), and its ablation times the same graph in alternation with
a variant of it, captured by a second `CudaGraphRunner`. In run S (docs/benchmarks.md) the same graph
object read up to 4 % apart in the two sections of one process (bs 1 x 4 at ctx 512: 0.998 ms in the
targets, 0.959 in the ablation; the 32-row decode 2.030 against 2.155), while three passes of the targets
agreed within 0.2 % and a second process repeated them. A first version of this script (run S, call 3) found
no effect of the partner: alone, beside the decode, beside itself and beside a copy all agreed, at the
ablation's figures. So this one asks about history: the engine is built as engine_bench's targets build it
(the same graph shapes, rows and context; with --server-graphs, the engine's default shapes, as `tokenrouter
serve` captures them), each point is timed before anything else runs, then after each action of --phases:
a large allocation taken and freed, steps run eagerly (the points' shapes and a prefill), a one-kernel graph
captured, pinned host buffers taken, the model's forward run on a new side stream (a runner's warm-up without
its capture), a second runner of one graph captured with PDL off, one with the defaults, a second runner of
the points' shapes, all of these dropped. Run S: call 4 (first, capture, drop) found that the second
runner's capture moved every step by -2.4 % to +6 % and dropping it did not move them back; call 5 (alloc,
eager, capture, drop) that neither allocation nor eager steps move them; call 6 (tiny, one, capture, with
--server-graphs) that a one-kernel graph does not and a runner of one graph does. Not run yet: `--phases
pinned,warm,one_nopdl,one`, which narrows it further.

Per point and phase: `alone` (back to back), `beside decode` (the targets' pairing), `replay only` (the graph's
replays timed with CUDA events, without the host's input staging); decodes alone.

    python3 bench/step_partner.py --points 1x4,1x8,4x8,16x4 --decode-bs 1,4,32 --ctx 512 --out out/step_partner
    python3 bench/step_partner.py --server-graphs --phases tiny,one,capture --out out/step_partner
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_bench as eb  # noqa: E402
from graph_timing import capture, replay_us  # noqa: E402

from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner  # noqa: E402

# the actions between measurements (--phases), and the column each one's measurement is shown under
ACTIONS = {
    "alloc": "after 4 GiB taken and freed",
    "eager": "after eager steps",
    "tiny": "after a one-kernel graph's capture",
    "pinned": "after pinned host buffers are taken",
    "warm": "after the model's forward on a new side stream",
    "one_nopdl": "after a second runner of one graph, captured with pdl off",
    "one": "after a second runner of one graph",
    "capture": "after a second runner's capture",
    "drop": "after they are dropped",
}


def measure(runner: CudaGraphRunner, ctxs: eb.Contexts, points, decode_bs, ctx: int) -> dict:
    """ms per step of each extend point (alone, beside its decode, replay only) and each decode (alone)."""
    out = {}
    for bs, q in points:
        fb = ctxs.batch(bs, ctx, q)
        ext, dec = eb.graph_step(runner, fb), eb.graph_step(runner, ctxs.batch(bs, ctx, 1))
        shape = runner.shape_for(fb)
        with torch.inference_mode():
            runner.load_batch(fb, shape)
        out[f"{bs}x{q}"] = dict(alone=eb.time_step(ext) * 1e3, beside_decode=eb.time_pair(ext, dec)[0] * 1e3)
        out[f"{bs}x{q}"]["replay_only"] = replay_us(runner.graphs[shape], reps=200) / 1e3
    for bs in decode_bs:
        out[f"{bs}x1"] = dict(alone=eb.time_step(eb.graph_step(runner, ctxs.batch(bs, ctx, 1))) * 1e3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--points", default="1x2,1x4,1x8,4x8,16x4", help="extends BSxQ (q >= 2), comma-separated")
    ap.add_argument("--decode-bs", type=eb.ints, default=[1, 4, 16, 32])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument(
        "--ctx-max", type=int, default=4096, help="KV slots per request (engine_bench: its largest ctx)"
    )
    ap.add_argument(
        "--phases",
        default="alloc,eager,capture,drop",
        help=f"what to do before each further measurement, in order: {', '.join(f'{k} ({v})' for k, v in ACTIONS.items())}",
    )
    ap.add_argument(
        "--server-graphs",
        action="store_true",
        help="capture the engine's default shapes (as a server) instead",
    )
    ap.add_argument("--out", default="out/step_partner")
    args = ap.parse_args(argv)
    args.phases = [a.strip() for a in args.phases.split(",") if a.strip()]
    if bad := [a for a in args.phases if a not in ACTIONS]:
        ap.error(f"--phases: unknown {', '.join(bad)}; expected {', '.join(ACTIONS)}")
    args.points = eb.parse_steps(args.points, "--points", min_q=2)
    if not torch.cuda.is_available():
        print("step_partner needs a CUDA GPU", file=sys.stderr)
        return 2
    points_bs, points_q = {bs for bs, _ in args.points}, {q for _, q in args.points}
    rows = max({64} | set(args.decode_bs) | points_bs)
    if args.server_graphs:  # the engine's default shapes, as `tokenrouter serve` captures them
        engine = eb.build_engine(args.shape, rows * args.ctx_max + 64, rows, graphs=True)
    else:  # engine_bench --targets' shapes: decodes at its decode and extend sizes, extends of {1,4,16} x {2,4,8}
        decode_sizes = tuple(sorted({1, 8, 32, 64} | {1, 4, 16} | set(args.decode_bs) | points_bs))
        config = CudaGraphConfig(
            decode_sizes, tuple(sorted({1, 4, 16} | points_bs)), tuple(sorted({2, 4, 8} | points_q))
        )
        engine = eb.build_engine(args.shape, rows * args.ctx_max + 64, rows, graphs=True, graph_config=config)
    ctxs = eb.Contexts(engine, rows, args.ctx_max)
    runner = engine.graph_runner
    print(f"{len(runner.graphs)} graphs captured", file=sys.stderr)
    phases = {"first": measure(runner, ctxs, args.points, args.decode_bs, args.ctx)}
    kept = []  # what the phases captured, alive until "drop"
    for action in args.phases:
        label = ACTIONS[action] + (f" ({len(phases)})" if ACTIONS[action] in phases else "")
        if action == "alloc":
            big = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
            del big
            torch.cuda.empty_cache()
        elif action == "eager":
            # the points' shapes and a prefill, as a server runs the shapes it has no graph for
            with torch.inference_mode():
                for bs, q in [*args.points, (1, args.ctx)]:
                    for _ in range(3):
                        eb.eager_step(engine, ctxs.batch(bs, args.ctx, q))()
            torch.cuda.synchronize()
        elif action == "tiny":
            x = torch.zeros(1024, device="cuda")
            kept.append(capture(lambda x=x: x.add_(1)))
        elif action == "pinned":  # as a runner's input ring
            kept.append([torch.zeros(1 << 16, dtype=torch.int64, pin_memory=True) for _ in range(4)])
        elif action == "warm":  # as a runner's warm-up before its capture, without the capture
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.inference_mode():
                for _ in range(2):
                    eb.eager_step(engine, ctxs.batch(1, args.ctx, 1))()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
        elif action == "one_nopdl":
            pdl, engine.attn_backend.pdl = engine.attn_backend.pdl, False
            try:
                kept.append(CudaGraphRunner(engine, CudaGraphConfig((1,), (), ())))
            finally:
                engine.attn_backend.pdl = pdl
        elif action == "one":
            kept.append(CudaGraphRunner(engine, CudaGraphConfig((1,), (), ())))
        elif action == "capture":
            shapes = CudaGraphConfig(tuple(args.decode_bs), tuple(sorted(points_bs)), tuple(sorted(points_q)))
            kept.append(CudaGraphRunner(engine, shapes))
        elif action == "drop":
            kept.clear()
            gc.collect()
            torch.cuda.empty_cache()
        phases[label] = measure(runner, ctxs, args.points, args.decode_bs, args.ctx)

    print(f"### {args.shape}, ctx {args.ctx}: the same graphs, ms per step, by phase of the process\n")
    names = list(phases)
    print("| step | measure | " + " | ".join(names) + " | last / first |")
    print("| --- | --- |" + " ---: |" * (len(names) + 1))
    for step in phases["first"]:
        for m in phases["first"][step]:
            vals = [phases[n][step][m] for n in names]
            cells = " | ".join(f"{v:.3f}" for v in vals)
            print(f"| {step} | {m.replace('_', ' ')} | {cells} | {vals[-1] / vals[0]:.3f} |", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "step_partner.json").write_text(
        json.dumps(
            dict(gpu=torch.cuda.get_device_name(), shape=args.shape, ctx=args.ctx, phases=phases), indent=1
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
