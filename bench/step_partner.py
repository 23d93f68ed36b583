"""Whether an engine step's measured time depends on the step timed in alternation with it.

`engine_bench.py --targets` times each extend graph in alternation with the decode of the same batch size
(`time_pair`: blocks of about 0.1 s, A B B A ...), and its ablation times the same graph in alternation with
a variant of it. In run S (docs/benchmarks.md) the same graph, in one process, read up to 4 % apart in the
two (the bs 1 x 4 extend at ctx 512: 0.998 ms beside the decode, 0.959 beside a variant), while three passes
of either agreed within 0.2 %. This script times each point's extend graph, in one process:

- `alone`: back to back, nothing in between (`time_step`);
- `beside decode`: in alternation with the decode of the same batch size (the targets' figure);
- `beside itself`: in alternation with the same graph (both sides the same work);
- `beside a copy`: in alternation with the same shape captured again by a second runner (the ablation's);
- `beside decode, 0.01 s blocks` / `200-call blocks`: the targets' pairing with shorter and longer blocks (a
  transient after each switch weighs more in short blocks);
- `replay only`: the graph's replays back to back timed with CUDA events, without the host's input staging.

    python3 bench/step_partner.py --points 1x4,1x8,4x8,16x4 --ctx 512 --out out/step_partner
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_bench as eb  # noqa: E402
from graph_timing import replay_us  # noqa: E402

from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--points", default="1x4,1x8,4x8,16x4", help="extends BSxQ (q >= 2), comma-separated")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--out", default="out/step_partner")
    args = ap.parse_args(argv)
    args.points = eb.parse_steps(args.points, "--points", min_q=2)
    if not torch.cuda.is_available():
        print("step_partner needs a CUDA GPU", file=sys.stderr)
        return 2
    bss = sorted({bs for bs, _ in args.points})
    qs = sorted({q for _, q in args.points})
    config = CudaGraphConfig(tuple(bss), tuple(bss), tuple(qs))
    rows = max(bss)
    engine = eb.build_engine(args.shape, rows * args.ctx + 64, rows, graphs=True, graph_config=config)
    copy = CudaGraphRunner(engine, config)  # the same shapes captured again, as the ablation's variant
    runner = engine.graph_runner
    ctxs = eb.Contexts(engine, rows, args.ctx)
    print(f"### {args.shape}, ctx {args.ctx}: one extend graph, ms per step, by what it is timed beside\n")
    cols = ["alone", "beside decode", "beside itself", "beside a copy", "beside decode, 0.01 s blocks",
            "beside decode, 200-call blocks", "replay only"]  # fmt: skip
    print("| bs x q | decode alone | " + " | ".join(cols) + " |")
    print("| --- | ---: |" + " ---: |" * len(cols))
    results = []
    for bs, q in args.points:
        fb, dec_fb = ctxs.batch(bs, args.ctx, q), ctxs.batch(bs, args.ctx, 1)
        ext, dec = eb.graph_step(runner, fb), eb.graph_step(runner, dec_fb)
        ext_copy = eb.graph_step(copy, fb)
        row = {"decode alone": eb.time_step(dec) * 1e3, "alone": eb.time_step(ext) * 1e3}
        row["beside decode"] = eb.time_pair(ext, dec)[0] * 1e3
        row["beside itself"] = eb.time_pair(ext, ext)[0] * 1e3
        row["beside a copy"] = eb.time_pair(ext, ext_copy)[0] * 1e3
        row["beside decode, 0.01 s blocks"] = eb.time_pair(ext, dec, target_s=0.01)[0] * 1e3
        row["beside decode, 200-call blocks"] = eb.time_pair(ext, dec, target_s=10.0)[0] * 1e3  # 200 at most
        shape = runner.shape_for(fb)
        with torch.inference_mode():
            runner.load_batch(fb, shape)
        row["replay only"] = replay_us(runner.graphs[shape], reps=200) / 1e3
        results.append(dict(bs=bs, q=q, ctx=args.ctx, **row))
        cells = " | ".join(f"{row[c]:.3f}" for c in cols)
        print(f"| {bs} x {q} | {row['decode alone']:.3f} | {cells} |", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "step_partner.json").write_text(
        json.dumps(dict(gpu=torch.cuda.get_device_name(), shape=args.shape, rows=results), indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
