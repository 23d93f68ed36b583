"""Tile configs of the linear kernels chosen inside the CUDA graph step, against the autotuner's choice.

Triton's autotuner times each candidate config of a kernel alone (`do_bench`: the kernel back to back, L2
flushed), so it never sees what a step in a CUDA graph does to it: under programmatic dependent launch a
kernel's first weight reads overlap the kernel before (on the H200, restricting `dot_rows` to
configs that read their whole weight slice early made the 0.6B's extends 4-18 % faster, although the
autotuner had ranked those configs below others). This script asks whether the autotuner's choice is the
best one inside the step: for each tuning key of a kernel (one per layer type: q/k/v, o, gate/up, down),
coordinate descent over candidate configs, each captured into fresh graphs (the autotuner's cache entry is
overridden; nothing is written to disk) and timed in alternation with the best so far on the steps that run
that kernel. Kernels: `dot_rows` (steps of 3-32 tokens; objective: `--objective`, by default the bs-1 extends
of 4 and 8 tokens, which run the 16-row block; `--objective 4x8` tunes the 32-row block's keys, with
`EngineTuning(dot_rows_max=32)` for this process's engine) and `gemv` (one-token steps; objective: the bs-1 decode).
`--maxnreg 128,168` also times each `dot_rows` candidate under those register caps (a cap lets more programs
share an SM, so that under PDL the next kernel's programs find room to start early; it may spill), and
`--start table` starts from the shipped table's configs instead of the autotuner's; `--keys` and `--tiles`
narrow the search to some layers and some tiles.

    python3 bench/graph_tune.py --shape qwen3-0.6b --kernels dot_rows --out out/graph_tune --table tiles.json

`--table` writes the tuned `dot_rows` configs as a table that the engine reads with
`EngineTuning(tuned_tiles_files=("tiles.json",))` (the shipped one, tuned_tiles.json, came from this script on the H200).
The table holds the tuned `gemv` configs as well (the one-token GEMV is autotuned the same way, and its
picks differed between machines), and `gemv_rows`' (the few-row GEMV of the
2-token steps; objective `--objective 1x2`).

Prints markdown tables; writes graph_tune.json under --out (after every key).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_bench import Contexts, build_engine, graph_step, parse_steps, time_pair  # noqa: E402

from tokenrouter.runtime.engine.attention import tuned_tiles  # noqa: E402
from tokenrouter.runtime.engine.config import EngineTuning  # noqa: E402
from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner  # noqa: E402
from tokenrouter.runtime.engine.kernels import dot_rows as kd  # noqa: E402
from tokenrouter.runtime.engine.kernels import linear as kl


def _desc(c: triton.Config) -> dict:
    out = dict(kwargs=dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages)
    if getattr(c, "maxnreg", None) is not None:
        out["maxnreg"] = c.maxnreg
    return out


def capped(c: triton.Config, maxnreg: int) -> triton.Config:
    """`c` with at most `maxnreg` registers per thread (more programs per SM, perhaps spills)."""
    return triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=maxnreg)


def table_config(config: dict) -> triton.Config:
    """A tuned tile table's config as the autotuner's."""
    kw = {k: config[k] for k in ("BLOCK_W", "BLOCK_K", "SPLIT_K")}
    return triton.Config(
        kw, num_warps=config["num_warps"], num_stages=config["num_stages"], maxnreg=config.get("maxnreg")
    )


# the kernels this script tunes, and whose results its --table holds
KERNELS = ("dot_rows", "gemv", "gemv_rows")
# `gemv_rows` is tuned for its 2-row block only (its autotuner of BLOCK_M 2: the engine's default reach, the
# 2-token steps); a table's key names the block
GEMV_ROWS_BLOCK = 2


def key_fields(key: tuple, kernel: str = "dot_rows") -> tuple[dict, str]:
    """An autotuner key of `dot_rows` (or `gemv`, `gemv_rows`) as the tuned tables' key fields, and the dtype's
    name."""
    names = kd.DOT_ROWS_KEY if kernel == "dot_rows" else kl.GEMV_KEY
    if kernel == "dot_rows" and isinstance(key[len(names) - 1], str):  # before BLOCK_X was in the key
        key = (*key[: len(names) - 1], 16, *key[len(names) - 1 :])  # (the 16-row block's tables): 16 rows
    fields = dict(zip(names, key[: len(names)], strict=True))
    if kernel == "gemv_rows":
        fields["BLOCK_M"] = GEMV_ROWS_BLOCK
    return fields, key[len(names)].removeprefix("torch.")


def dot_rows_candidates(k: int) -> list[triton.Config]:
    """The product's one-tile configs for this K, and one-tile configs of every (BLOCK_W, BLOCK_K) with the
    fewest splits that cover K (at most the scratch's split count), 4 warps (and 8 for 256-1024 wide tiles)."""
    out = [
        c for c in kd._DOT_ROWS_ONE_TILE_CONFIGS if triton.cdiv(k, c.kwargs["SPLIT_K"]) <= c.kwargs["BLOCK_K"]
    ]
    seen = {(c.kwargs["BLOCK_W"], c.kwargs["BLOCK_K"], c.kwargs["SPLIT_K"], c.num_warps) for c in out}
    for bw in (16, 32, 64, 128):
        for bk in (128, 256, 512, 1024):
            split = triton.cdiv(k, bk)
            if split > kd._DOT_ROWS_MAX_SPLIT or bw * bk > 64 * 512:  # registers / shared memory
                continue
            for warps in (4, 8) if bk >= 256 else (4,):
                if (bw, bk, split, warps) in seen:
                    continue
                seen.add((bw, bk, split, warps))
                out.append(
                    triton.Config(
                        {"BLOCK_W": bw, "BLOCK_K": bk, "SPLIT_K": split}, num_warps=warps, num_stages=1
                    )
                )
    return out


def explicit_tiles(text: str) -> list[triton.Config]:
    """--tiles "64,256,12,4;64,256,12,8": one-stage dot_rows configs (ValueError naming a bad one)."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(";"))):
        parts = item.split(",")
        if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"{item!r} is not BLOCK_W,BLOCK_K,SPLIT_K,warps")
        bw, bk, sk, warps = (int(p) for p in parts)
        kd.check_tile_config(
            "dot_rows", dict(BLOCK_W=bw, BLOCK_K=bk, SPLIT_K=sk, num_warps=warps, num_stages=1)
        )
        out.append((bw, bk, sk, warps, 1))
    return kd._dot_configs(out)


def objective_steps(text: str) -> list[tuple[int, int]]:
    """--objective "1x4,1x8": (requests, new tokens each) per extend; at most 32 tokens, q >= 2."""
    steps = parse_steps(text, "--objective", min_q=2, max_tokens=kd.DOT_ROWS_LIMIT)
    if len({bs * q <= 16 for bs, q in steps}) > 1:
        raise SystemExit("--objective: one or more extends, all of at most 16 tokens or all of 17-32")
    return steps


def table_entries(results: dict) -> list[dict]:
    """The tuned dot_rows, gemv and gemv_rows configs as `tuned_tiles` table entries (the autotuner's key: N,
    K, then its flags; gemv_rows' with its block)."""
    entries = []
    for kernel in KERNELS:
        for row in results.get(kernel, []):
            # dtype: X's, the first tensor argument
            fields, dtype = key_fields(ast.literal_eval(row["key"]), kernel)
            best = row["best"]
            config = dict(best["kwargs"], num_warps=best["num_warps"], num_stages=best["num_stages"])
            if best.get("maxnreg") is not None:
                config["maxnreg"] = best["maxnreg"]
            entries.append(dict(gpu=results["gpu"], kernel=kernel, dtype=dtype, key=fields, config=config))
    return entries


def tune_kernel(
    name,
    autotuner,
    candidates_for,
    wanted,
    engine,
    ctxs,
    graph_cfg,
    cases,
    results,
    deadline,
    maxnreg=(),
    only=(),
) -> None:
    """Coordinate descent per tuning key, from the config in the autotuner's cache; with `maxnreg`, the
    starting config under each register cap is timed first, and every candidate also under each cap; with
    `only` ((N, K) pairs), those layers' keys alone."""
    keys = [key for key in autotuner.cache if wanted(key)]
    if only:
        keys = [key for key in keys if (key[0], key[1]) in only]
    rows = results.setdefault(name, [])
    print(f"\n### {name}: {len(keys)} tuning keys; objective: {', '.join(c for c, _ in cases)}\n", flush=True)
    print(
        "| key (N, K, flags) | autotuner's config | best in the graph | candidates timed | objective, best / autotuner's |"
    )
    print("| --- | --- | --- | ---: | ---: |", flush=True)
    for i, key in enumerate(keys):
        now = time.monotonic()
        if now > deadline:
            print(f"(deadline: {name} stopped before key {key})", flush=True)
            break
        key_deadline = now + (deadline - now) / (len(keys) - i)  # the time left, shared by the keys left
        chosen = autotuner.cache[key]
        n, k = key[0], key[1]
        best = chosen
        best_runner = CudaGraphRunner(engine, graph_cfg)
        steps_best = [graph_step(best_runner, fb) for _, fb in cases]
        total = 1.0  # the objective relative to the autotuner's choice
        timed = 0
        base = candidates_for(n, k)
        cands = [capped(chosen, r) for r in maxnreg] + base + [capped(c, r) for c in base for r in maxnreg]
        for cand in cands:
            if time.monotonic() > key_deadline:
                break
            if str(cand) == str(best):
                continue
            autotuner.cache[key] = cand
            try:
                runner = CudaGraphRunner(engine, graph_cfg)
            except Exception as e:  # noqa: BLE001 — a config this GPU cannot run (resources)
                print(f"  {cand}: {type(e).__name__}", flush=True)
                autotuner.cache[key] = best
                continue
            timed += 1
            ratio = 0.0
            for (_, fb), step_best in zip(cases, steps_best, strict=True):
                t_best, t_cand = time_pair(step_best, graph_step(runner, fb))
                ratio += t_cand / t_best / len(cases)
            if ratio < 0.99:  # a clear gain: the candidate becomes the best
                best, best_runner, total = cand, runner, total * ratio
                steps_best = [graph_step(best_runner, fb) for _, fb in cases]
            else:
                del runner
            autotuner.cache[key] = best
        autotuner.cache[key] = best
        rows.append(
            dict(key=repr(key), autotuner=_desc(chosen), best=_desc(best), timed=timed, objective=total)
        )
        print(f"| {key[:6]} | {chosen} | {best} | {timed} | {total:.3f} |", flush=True)
        del best_runner
        torch.cuda.empty_cache()


def compare(engine, ctxs, graph_cfg, autotuners, chosen, tuned, cases, results) -> None:
    """The autotuner's configs against the tuned ones, every case, side by side."""
    print("\n### The autotuner's configs against the ones tuned in the graph\n")
    print("| step | autotuner's (ms) | tuned (ms) | tuned / autotuner's |")
    print("| --- | ---: | ---: | ---: |", flush=True)
    for tuner, picks in zip(autotuners, chosen, strict=True):
        tuner.cache.update(picks)
    base = CudaGraphRunner(engine, graph_cfg)
    for tuner, picks in zip(autotuners, tuned, strict=True):
        tuner.cache.update(picks)
    new = CudaGraphRunner(engine, graph_cfg)
    for label, fb in cases:
        a, b = time_pair(graph_step(base, fb), graph_step(new, fb), rounds=6)
        results.setdefault("compare", []).append(dict(step=label, autotuner_ms=a * 1e3, tuned_ms=b * 1e3))
        print(f"| {label} | {a * 1e3:.3f} | {b * 1e3:.3f} | {b / a:.3f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument(
        "--kernels", default="dot_rows,gemv", help="dot_rows, gemv and/or gemv_rows (comma-separated)"
    )
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--deadline-s", type=float, default=420.0, help="stop tuning after this; then compare")
    ap.add_argument("--out", default="out/graph_tune")
    ap.add_argument(
        "--table",
        default=None,
        help="write the tuned dot_rows configs here, in the format that "
        "EngineTuning.tuned_tiles_files reads (tokenrouter/runtime/engine/attention/tuned_tiles.py)",
    )
    ap.add_argument(
        "--objective",
        default="1x4,1x8",
        help="dot_rows' objective, extends BSxQ (requests x new tokens each); the 16-row block's keys are tuned "
        "when every step has at most 16 tokens, else the 32-row block's",
    )
    ap.add_argument(
        "--maxnreg",
        default="",
        help="register caps per thread to try as well, e.g. 128,168: each candidate config also under each "
        "cap (dot_rows only; more programs fit on an SM)",
    )
    ap.add_argument(
        "--start",
        choices=("autotuner", "table"),
        default="autotuner",
        help="dot_rows' starting configs: the autotuner's, or the shipped tuned table's where it has the key "
        "(then the comparison is against the table)",
    )
    ap.add_argument("--keys", default="", help="tune only these layers' keys, NxK (e.g. 1024x3072,6144x1024)")
    ap.add_argument(
        "--tiles",
        default="",
        help="dot_rows' candidates instead of the generated ones: BLOCK_W,BLOCK_K,SPLIT_K,warps[;...] (one stage)",
    )
    args = ap.parse_args()
    try:
        tiles = explicit_tiles(args.tiles)
    except ValueError as e:
        raise SystemExit(f"--tiles {args.tiles!r}: {e}") from None
    try:
        only = {tuple(int(v) for v in item.lower().split("x")) for item in filter(None, args.keys.split(","))}
        if any(len(pair) != 2 for pair in only):
            raise ValueError("expected NxK")
    except ValueError:
        raise SystemExit(f"--keys {args.keys!r}: expected layers as NxK, e.g. 1024x3072,6144x1024") from None
    try:
        maxnreg = tuple(int(r) for r in filter(None, args.maxnreg.split(",")))
        for r in maxnreg:
            kd.check_tile_config(
                "dot_rows", dict(BLOCK_W=16, BLOCK_K=16, SPLIT_K=1, num_warps=4, num_stages=1, maxnreg=r)
            )
    except ValueError as e:
        raise SystemExit(f"--maxnreg {args.maxnreg!r}: {e}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.deadline_s
    steps = objective_steps(args.objective)
    names = args.kernels.split(",")
    if unknown := set(names) - set(KERNELS):
        raise SystemExit(
            f"--kernels: {', '.join(sorted(unknown))}: expected {', '.join(KERNELS[:-1])} or {KERNELS[-1]}"
        )
    if "gemv_rows" in names and not any(bs * q == GEMV_ROWS_BLOCK for bs, q in steps):
        raise SystemExit("--kernels gemv_rows: its objective is a 2-token extend (--objective 1x2)")
    sizes = sorted({1, *(bs for bs, _ in steps)})
    graph_cfg = CudaGraphConfig(
        tuple(sizes), tuple(sorted({bs for bs, _ in steps})), tuple(sorted({q for _, q in steps}))
    )
    # dot_rows' keys of the objective's row block (16 or 32 rows)
    block_x = 16 if max(bs * q for bs, q in steps) <= 16 else 32
    # the autotuner's choices are the starting point: the engine's shipped table must not replace them; with
    # tuned_tiles off the engine's default reach is 16 tokens
    tuning = EngineTuning(tuned_tiles=False, dot_rows_max=kd.DOT_ROWS_LIMIT if block_x == 32 else None)
    # autotunes every key
    engine = build_engine(args.shape, 4096 * max(sizes) + 64, max(sizes), True, graph_cfg, tuning)
    ctxs = Contexts(engine, max(sizes), 4096)
    shapes = [(f"decode bs {bs}", bs, 1) for bs in sizes] + [
        (f"extend bs {bs} x {q}", bs, q) for bs, q in steps
    ]
    cases = {label: ctxs.batch(bs, args.ctx, q) for label, bs, q in shapes}
    results: dict = dict(
        shape=args.shape, ctx=args.ctx, gpu=torch.cuda.get_device_name(), objective=args.objective
    )
    kernels = {
        "dot_rows": (
            kd._dot_rows,
            lambda n, k: list(tiles) if tiles else dot_rows_candidates(k),
            [f"extend bs {bs} x {q}" for bs, q in steps],
            lambda key: key[kd.DOT_ROWS_KEY.index("BLOCK_X")] == block_x,
        ),
        "gemv": (kl._gemv, lambda n, k: list(kl._GEMV_CONFIGS), ["decode bs 1"], lambda key: True),
        "gemv_rows": (
            kl._gemv_few[GEMV_ROWS_BLOCK],
            lambda n, k: list(kl._GEMV_FEW_CONFIGS[GEMV_ROWS_BLOCK]),
            [f"extend bs {bs} x {q}" for bs, q in steps if bs * q == GEMV_ROWS_BLOCK],
            lambda key: True,
        ),
    }
    if args.start == "table":
        started = 0
        for key in list(kd._dot_rows.cache):
            fields, dtype = key_fields(key)
            config = tuned_tiles.lookup("dot_rows", engine.device, getattr(torch, dtype), **fields)
            if config is not None:
                kd._dot_rows.cache[key] = table_config(config)
                started += 1
        print(
            f"dot_rows: {started} of {len(kd._dot_rows.cache)} keys start from the shipped table", flush=True
        )
    todo = [kernels[name] for name in names]
    chosen = [dict(t.cache) for t, *_ in todo]
    for name, (tuner, cands, objective, wanted) in zip(names, todo, strict=True):
        cases_ = [(c, cases[c]) for c in objective]
        caps = maxnreg if name == "dot_rows" else ()
        tune_kernel(
            name, tuner, cands, wanted, engine, ctxs, graph_cfg, cases_, results, deadline, caps, only
        )
        (out / "graph_tune.json").write_text(json.dumps(results, indent=1))
    tuned = [dict(t.cache) for t, *_ in todo]
    if args.table and any(kernel in results for kernel in KERNELS):
        Path(args.table).write_text(json.dumps(dict(entries=table_entries(results)), indent=1) + "\n")
    compare(engine, ctxs, graph_cfg, [t for t, *_ in todo], chosen, tuned, list(cases.items()), results)
    results["ctx_4096"] = []
    long = {f"{label} (ctx 4096)": ctxs.batch(bs, 4096, q) for label, bs, q in shapes}
    compare(engine, ctxs, graph_cfg, [t for t, *_ in todo], chosen, tuned, list(long.items()), results)
    (out / "graph_tune.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
