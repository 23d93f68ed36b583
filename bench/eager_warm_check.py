"""Does `EmbeddedEngine.warm_eager` leave a served step outside the CUDA graphs nothing to build?

Run 130 (docs/matrix.md, "Runs 127-130") had the 32B's first extend of 93 tokens at batch size 3 take 1227 ms
instead of about 64: three of the engine's own Triton kernels were built in it. For each `--shape`, in a fresh
process with an empty Triton cache (so every kernel load is a build), first without the warm-up and then with
it: the engine on dummy weights with its CUDA graphs; `warm_eager` (second pass only); then one seeded sample
of steps that no graph holds, on held requests as a server has them:

  long     1-4 rows, one of them 65-400 new tokens (a request back from a long visit), the others 1-8
  prefill  a new prompt of 65-600 tokens, alone or beside 1-3 decode rows
  wide     17-40 rows of 2-4 new tokens (more returning rows than the extend graphs hold)
  decode   65-120 rows of one token (more than the decode graphs hold)

Per pass: the warm-up's steps, kernel loads and seconds; the sample's kernel loads and the ms they took, its
median and slowest step, the kinds of step that loaded kernels, and each such step's shape and kernels. Prints a table, and JSON with --json.

    python bench/eager_warm_check.py --shape qwen3-0.6b,qwen3-32b [--steps 40] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

KINDS = ("long", "prefill", "wide", "decode")
HELD = 128  # requests held before the sample (prefilled in graph-sized steps)


def sample_steps(n: int, seed: int) -> list[tuple[str, list[tuple[int | None, int]]]]:
    """n steps as (kind, rows), each row (index of a held request, or None for a new prompt; new tokens)."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        kind = KINDS[k % len(KINDS)]
        if kind == "long":
            idx = rng.sample(range(HELD), rng.randint(1, 4))
            rows = [(idx[0], rng.randint(65, 400))] + [(i, rng.randint(1, 8)) for i in idx[1:]]
        elif kind == "prefill":
            rows = [(None, rng.randint(65, 600))] + [
                (i, 1) for i in rng.sample(range(HELD), rng.randint(0, 3))
            ]
        elif kind == "wide":
            rows = [(i, rng.randint(2, 4)) for i in rng.sample(range(HELD), rng.randint(17, 40))]
        else:
            rows = [(i, 1) for i in rng.sample(range(HELD), rng.randint(65, 120))]
        out.append((kind, rows))
    return out


def child(shape: str, warm: bool, steps: int, seed: int) -> dict:
    import torch
    from engine_bench import build_engine

    from tokenrouter.runtime.engine import kernel_loads
    from tokenrouter.runtime.engine.base import StepInput

    kernel_loads.install()
    loads = kernel_loads.LOADS
    t0 = time.perf_counter()
    engine = build_engine(shape, 65536, 256, graphs=True)
    start_s = time.perf_counter() - t0
    out = {"shape": shape, "warm": warm, "start_s": start_s, "loads_at_start": loads.count}
    before, t0 = loads.snapshot(), time.perf_counter()
    out["warm_steps"] = engine.warm_eager() if warm else 0
    torch.cuda.synchronize()
    out["warm_loads"], out["warm_ms"] = loads.since(before)[0], (time.perf_counter() - t0) * 1000.0
    vocab = engine.info.vocab_size
    rng = random.Random(seed + 1)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    for i in range(0, HELD, 16):  # (16, 16) is a captured extend shape: no eager step here
        engine.forward([StepInput(f"held{j}", tokens(16)) for j in range(i, i + 16)])
    torch.cuda.synchronize()
    out["held_loads"] = loads.count - out["loads_at_start"] - out["warm_loads"]
    times, built, where = [], {k: 0 for k in KINDS}, []
    load_ms = 0.0
    for k, (kind, rows) in enumerate(sample_steps(steps, seed)):
        batch = [StepInput(f"held{i}" if i is not None else f"new{k}", tokens(n)) for i, n in rows]
        before, t0 = loads.snapshot(), time.perf_counter()
        engine.forward(batch)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000.0)
        n_loads, ms, names = loads.since(before)
        built[kind] += n_loads
        if n_loads:  # the kernels, and the step's rows and tokens (at most the last few names are kept)
            where.append(f"{kind} bs {len(rows)} q {max(n for _, n in rows)} T {sum(n for _, n in rows)}: "
                         f"{', '.join(names)}")  # fmt: skip
        load_ms += ms
        engine.release(f"new{k}")
    out.update(sample_loads=sum(built.values()), sample_load_ms=load_ms, loads_by_kind=built,
               median_ms=statistics.median(times), max_ms=max(times), loaded_in=where)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-0.6b,qwen3-32b")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=2, metavar=("SHAPE", "WARM"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(child(a.child[0], a.child[1] == "1", a.steps, a.seed)), flush=True)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("eager_warm_check needs a CUDA GPU", file=sys.stderr)
        return 2
    results = []
    for shape in a.shape.split(","):
        for warm in (False, True):
            with tempfile.TemporaryDirectory() as cache:  # an empty Triton cache: every load is a build
                env = {**os.environ, "TRITON_CACHE_DIR": cache}
                cmd = [sys.executable, __file__, "--child", shape, "1" if warm else "0",
                       "--steps", str(a.steps), "--seed", str(a.seed)]  # fmt: skip
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not lines:
                print(
                    f"{shape} warm={warm}: failed (rc {proc.returncode})\n{proc.stderr[-3000:]}",
                    file=sys.stderr,
                )
                return 1
            results.append(json.loads(lines[-1][len("RESULT ") :]))
    head = ("| shape | warm-up | its steps | its loads | its s | sample loads | their ms | median step ms "
            "| slowest step ms | loads by kind |")  # fmt: skip
    print(head)
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        kinds = ", ".join(f"{k} {v}" for k, v in r["loads_by_kind"].items() if v) or "-"
        print(f"| {r['shape']} | {'yes' if r['warm'] else 'no'} | {r['warm_steps']} | {r['warm_loads']} | "
              f"{r['warm_ms'] / 1000:.2f} | {r['sample_loads']} | {r['sample_load_ms']:.0f} | {r['median_ms']:.1f} | "
              f"{r['max_ms']:.1f} | {kinds} |")  # fmt: skip
    for r in results:
        for line in r["loaded_in"]:
            print(f"{r['shape']}, warm-up {'yes' if r['warm'] else 'no'}: loads in {line}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
