"""Where a CUDA-graph step's time goes between its linear kernels, and how much programmatic dependent
launch (PDL) overlaps them: a timeline of every `dot_rows` launch in the step, read from the GPU's own timer.

Nsight Systems does not run on the GPU machine, so `dot_rows` records it itself (`DotTrace`, a diagnostic
that is off unless a trace is active): each program writes the global timer when it starts, when its PDL
wait returns (the kernel before it has finished) and when it ends, and its SM. The step's graphs are
captured with the trace on and replayed; per launch this gives

- how many programs started before the kernel before it had finished (`early`), and how long before
  (`lead`): what PDL overlaps, for this kernel's early weight reads;
- how long the kernel ran after the one before it finished (`exposed`): its share of the step;
- the time between one linear kernel's end and the next one's wait: the kernels in between (RMSNorm; q/k
  norm, rotary and the KV store, then attention), with their own launch latency.

Per layer of a decoder this splits the step into eight segments; each is averaged over the layers. The
compiled kernel's registers and shared memory give how many of its programs fit on one SM beside nothing
else (`fit/SM`; the H100/H200 limits: 64K registers, 228 KB of shared memory, 64 warps, 32 programs).

    python3 bench/pdl_timeline.py --shape qwen3-0.6b --ctx 512 --steps 4x1,1x8,2x8,4x8 --out out/timeline

Run with TOKENROUTER_DOT_ROWS=32 for the 17-32 token steps to run `dot_rows` (else they run cuBLAS and
record nothing). Prints markdown tables; writes pdl_timeline.json under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the segments of one decoder layer, in order: a linear kernel's exposed time, then what runs until the
# next linear kernel's wait returns
SEGMENTS = (
    ("qkv", "q/k/v projection"),
    ("qkv>o", "q/k norm, rotary, KV store; attention"),
    ("o", "o projection"),
    ("o>gate_up", "add & RMSNorm"),
    ("gate_up", "gate/up projection"),
    ("gate_up>down", "(nothing: the PDL hand-over)"),
    ("down", "down projection (SiLU * up folded)"),
    ("down>qkv", "add & RMSNorm (next layer)"),
)


def parse_steps(text: str) -> list[tuple[int, int]]:
    """Steps as "4x1,1x8": (requests, new tokens each) per step; q = 1 is a decode."""
    from engine_bench import parse_steps as parse

    return parse(text, "--steps")


def fit_per_sm(regs: int, shared: int, warps: int) -> int:
    """Programs of one kernel that fit on one Hopper SM by its registers (allocated per warp in units of
    256), shared memory (1 KB reserved per program) and warps."""
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = 65536 // max(1, per_warp * warps)
    by_shared = (228 * 1024) // (shared + 1024)
    return max(0, min(by_regs, by_shared, 64 // warps, 32))


def launch_stats(launch: dict) -> dict:
    """One launch's timeline summarised (times in µs; `start`, `waited`, `end`: the first program's start and
    wait return, the last program's end, in ns of the GPU's timer)."""
    tl = launch["timeline"]
    start = [r[0] for r in tl]
    waited = min(r[1] for r in tl)
    end = max(r[2] for r in tl)
    out = dict(
        n=launch["n"],
        k=launch["k"],
        rows=launch["rows"],
        programs=len(tl),
        sms=len({r[3] for r in tl}),
        early=sum(s < waited for s in start) / len(tl),
        lead_us=(waited - min(start)) / 1e3,
        late_start_us=max(0, max(start) - waited) / 1e3,
        exposed_us=(end - waited) / 1e3,
        start=min(start),
        waited=waited,
        end=end,
    )
    if "regs" in launch:
        out.update(regs=launch["regs"], shared=launch["shared"], warps=launch["warps"])
        out["fit_per_sm"] = fit_per_sm(launch["regs"], launch["shared"], launch["warps"])
    return out


def roles(hidden: int, q_dim: int, kv_dim: int, inter: int) -> dict[tuple[int, int], str]:
    """(N, K) of each linear layer of a decoder layer -> its name."""
    return {
        (q_dim + 2 * kv_dim, hidden): "qkv",
        (hidden, q_dim): "o",
        (2 * inter, hidden): "gate_up",
        (hidden, inter): "down",
    }


def layer_segments(stats: list[dict], names: dict[tuple[int, int], str]) -> dict[str, list[float]]:
    """Per segment (SEGMENTS), its time in µs for each layer: the launches are taken in order, four per
    layer (q/k/v, o, gate/up, down); a launch whose (N, K) is not a decoder layer's (the LM head) ends it."""
    order = ("qkv", "o", "gate_up", "down")
    named = [(names.get((s["n"], s["k"])), s) for s in stats]
    seg: dict[str, list[float]] = {key: [] for key, _ in SEGMENTS}
    i = 0
    while i + 4 <= len(named) and tuple(n for n, _ in named[i : i + 4]) == order:
        layer = [s for _, s in named[i : i + 4]]
        nxt = named[i + 4][1] if i + 4 < len(named) and named[i + 4][0] == "qkv" else None
        for j, name in enumerate(order):
            seg[name].append(layer[j]["exposed_us"])
            after = layer[j + 1] if j < 3 else nxt
            if after is not None:
                seg[f"{name}>{order[j + 1] if j < 3 else 'qkv'}"].append(
                    (after["waited"] - layer[j]["end"]) / 1e3
                )
        i += 4
    return seg


def print_step(title: str, entry: dict, reps: list[list[dict]], names: dict) -> None:
    """One step's segments (median over the replays of the per-layer mean) and per linear kernel."""
    print(f"\n### {title}: {entry['step_ms']:.3f} ms (traced {entry['traced_step_ms']:.3f}); first to last "
          f"linear kernel {statistics.median(entry['span_us']):.0f} µs\n")  # fmt: skip
    print("| segment (per layer, median of replays) | µs | × layers |")
    print("| --- | ---: | ---: |")
    layers = sum(1 for s in reps[0] if names.get((s["n"], s["k"])) == "qkv")
    for key, what in SEGMENTS:
        vals = [r[key] for r in entry["segments"] if r[key] is not None]
        if vals:
            v = statistics.median(vals)
            print(f"| {key}: {what} | {v:.2f} | {v * layers:.0f} |")
    print("\n| linear kernel | programs | SMs | fit/SM (regs, shared KB, warps) | early | lead µs | late start µs "
          "| exposed µs |")  # fmt: skip
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for role in ("qkv", "o", "gate_up", "down"):
        mine = [s for stats in reps for s in stats if names.get((s["n"], s["k"])) == role]
        if not mine:
            continue
        s0 = mine[0]
        fit = "?"
        if "fit_per_sm" in s0:
            fit = f"{s0['fit_per_sm']} ({s0['regs']}, {s0['shared'] / 1024:.0f}, {s0['warps']})"
        med = {
            k: statistics.median(s[k] for s in mine)
            for k in ("early", "lead_us", "late_start_us", "exposed_us")
        }
        print(f"| {role} ({s0['n']} x {s0['k']}) | {s0['programs']} | {s0['sms']} | {fit} | {med['early']:.2f} | "
              f"{med['lead_us']:.2f} | {med['late_start_us']:.2f} | {med['exposed_us']:.2f} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--steps", default="4x1,1x8,2x8,4x8", help="BSxQ per step (q = 1: decode)")
    ap.add_argument("--replays", type=int, default=5, help="traced replays per step (each summarised)")
    ap.add_argument("--out", default="out/pdl_timeline")
    args = ap.parse_args(argv)
    steps = parse_steps(args.steps)

    import torch
    from engine_bench import Contexts, build_engine, graph_step, time_pair

    from tokenrouter.runtime.engine.attention.triton_kernels import DotTrace
    from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner

    if not torch.cuda.is_available():
        raise SystemExit("pdl_timeline reads the GPU's timer: it needs a CUDA GPU")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    max_bs = max(bs for bs, _ in steps)
    engine = build_engine(args.shape, (args.ctx + 64) * max_bs + 64, max_bs, graphs=False)
    ctxs = Contexts(engine, max_bs, args.ctx)
    cfg = engine.model_config
    q_dim = cfg.num_attention_heads * cfg.head_dim
    names = roles(cfg.hidden_size, q_dim, cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size)
    results: dict = dict(shape=args.shape, ctx=args.ctx, gpu=torch.cuda.get_device_name(), steps={})
    for bs, q in steps:
        label = f"{bs}x{q}"
        graphs = CudaGraphConfig((bs,), (), ()) if q == 1 else CudaGraphConfig((), (bs,), (q,))
        fb = ctxs.batch(bs, args.ctx, q)
        plain = CudaGraphRunner(engine, graphs)  # also autotunes, outside the trace
        with DotTrace(engine.device) as trace:
            traced = CudaGraphRunner(engine, graphs)
        t_plain, t_traced = time_pair(graph_step(plain, fb), graph_step(traced, fb))
        reps = []
        for _ in range(args.replays):
            trace.clear()
            graph_step(traced, fb)()
            torch.cuda.synchronize()
            stats = [launch_stats(launch) for launch in trace.read()]
            if stats:
                reps.append(stats)
        del plain, traced
        entry = dict(step_ms=t_plain * 1e3, traced_step_ms=t_traced * 1e3, replays=[])
        results["steps"][label] = entry
        if not reps:
            print(f"\n{label}: no dot_rows launch in the step (GEMV or cuBLAS; see TOKENROUTER_DOT_ROWS)")
            continue
        for stats in reps:
            entry["replays"].append(
                [{k: v for k, v in s.items() if k not in ("start", "waited", "end")} for s in stats]
            )
            seg = layer_segments(stats, names)
            entry.setdefault("segments", []).append(
                {k: statistics.mean(v) if v else None for k, v in seg.items()}
            )
            span = max(s["end"] for s in stats) - min(s["start"] for s in stats)
            entry.setdefault("span_us", []).append(span / 1e3)
        title = f"{args.shape}, step {label} (ctx {args.ctx})"
        print_step(title, entry, reps, names)
        (out / "pdl_timeline.json").write_text(json.dumps(results, indent=1))
        torch.cuda.empty_cache()
    (out / "pdl_timeline.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
