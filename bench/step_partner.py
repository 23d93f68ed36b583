"""Whether an engine step's measured time depends on what it is timed beside, or on the process's history.

`engine_bench.py --targets` times each extend graph in alternation with the decode of the same batch size
(`time_pair`: blocks of about 0.1 s, A B B A ...), and its ablation times the same graph in alternation with
a variant of it, captured by a second `CudaGraphRunner`. In run S (docs/benchmarks.md) the same graph
object read up to 4 % apart in the two sections of one process (bs 1 x 4 at ctx 512: 0.998 ms in the
targets, 0.959 in the ablation; the 32-row decode 2.030 against 2.155), while three passes of the targets
agreed within 0.2 % and a second process repeated them. A first version of this script (run S, call 3) found
no effect of the partner: alone, beside the decode, beside itself and beside a copy all agreed, at the
ablation's figures. So this one asks about history: the engine is built as engine_bench's targets build it
(the same graph shapes, rows and context), each point is timed before anything else runs, then after each of
what a process may do between measurements: a large allocation taken and freed, steps run eagerly (the
points' shapes and a prefill), a second runner capturing graphs, that runner dropped. (Run S, call 4, with
the first, the fourth and the fifth phase only: the second runner's capture moved every step by -2.4 % to
+6 %, and dropping it did not move them back.)

Per point and phase: `alone` (back to back), `beside decode` (the targets' pairing), `replay only` (the graph's
replays timed with CUDA events, without the host's input staging); decodes alone.

    python3 bench/step_partner.py --points 1x4,1x8,4x8,16x4 --decode-bs 1,4,32 --ctx 512 --out out/step_partner
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
from graph_timing import replay_us  # noqa: E402

from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner  # noqa: E402


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
    ap.add_argument("--out", default="out/step_partner")
    args = ap.parse_args(argv)
    args.points = eb.parse_steps(args.points, "--points", min_q=2)
    if not torch.cuda.is_available():
        print("step_partner needs a CUDA GPU", file=sys.stderr)
        return 2
    # the graphs of engine_bench --targets: decodes at its decode and extend sizes, extends of bs {1,4,16} x q
    # {2,4,8}, rows for the largest decode, each request ctx_max slots
    decode_sizes = tuple(
        sorted({1, 8, 32, 64} | {1, 4, 16} | set(args.decode_bs) | {bs for bs, _ in args.points})
    )
    extend_bs = tuple(sorted({1, 4, 16} | {bs for bs, _ in args.points}))
    extend_q = tuple(sorted({2, 4, 8} | {q for _, q in args.points}))
    config = CudaGraphConfig(decode_sizes, extend_bs, extend_q)
    rows = max(decode_sizes)
    engine = eb.build_engine(args.shape, rows * args.ctx_max + 64, rows, graphs=True, graph_config=config)
    ctxs = eb.Contexts(engine, rows, args.ctx_max)
    runner = engine.graph_runner

    def timed() -> dict:
        return measure(runner, ctxs, args.points, args.decode_bs, args.ctx)

    phases = {"first": timed()}
    # what a process may do between captures: take and free a large allocation, run steps eagerly (the
    # points' shapes and a 512-token prefill, as a serving engine runs the shapes it has no graph for)
    big = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    del big
    torch.cuda.empty_cache()
    phases["after 4 GiB taken and freed"] = timed()
    with torch.inference_mode():
        for bs, q in [*args.points, (1, args.ctx)]:
            for _ in range(3):
                eb.eager_step(engine, ctxs.batch(bs, args.ctx, q))()
        torch.cuda.synchronize()
    phases["after eager steps"] = timed()
    copy = CudaGraphRunner(engine, CudaGraphConfig(tuple(args.decode_bs), extend_bs, extend_q))
    phases["after a second runner's capture"] = timed()
    del copy
    gc.collect()
    torch.cuda.empty_cache()
    phases["after it is dropped"] = timed()

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
