"""The Triton autotuner's picks for the linear kernels, read from Triton's disk cache, as a tuned tile table.

On a GPU model the shipped table (tokenrouter/runtime/engine/attention/tuned_tiles.json) has no entries for,
every autotuned launch of a fresh machine's start builds every candidate config of its kernel and times them:
most of the Triton builds of a plan's start. After one start there (any `serve`, `bench` or engine run of the
plan's models), each choice sits in Triton's cache directory as `<kernel>.autotune.json` (the key and every
candidate's time: `_autotune` caches results). This script turns them into table entries for that GPU
model, which the engine then reads instead of autotuning: a later fresh machine of that model builds one
config per launch.

    python3 bench/autotune_table.py --cache ~/.triton/cache --out tiles.json [--into tuned_tiles.json]

`--into TABLE` adds the entries to an existing table where it has none for the same GPU, kernel, dtype and
key (entries tuned in the graph step, `bench/graph_tune.py`, stay). Kernels: `dot_rows`, `gemv` (its full
candidate list; the `extra_tiles=False` autotuner is a benchmark's) and `gemv_rows` (each row block's).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenrouter.runtime.engine.attention import tuned_tiles

FILES = {"_dot_rows_kernel": "dot_rows", "_gemv_kernel": "gemv", "_gemv_few_kernel": "gemv_rows"}


def _tiles(configs) -> frozenset:
    """A candidate list as comparable (kwargs, warps, stages) items."""
    return frozenset((tuple(sorted(c["kwargs"].items())), c["num_warps"], c["num_stages"]) for c in configs)


def _as_dicts(configs) -> list[dict]:
    return [dict(kwargs=c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages) for c in configs]


def _key_names(kernel: str) -> list[str]:
    from tokenrouter.runtime.engine.kernels import dot_rows as kd
    from tokenrouter.runtime.engine.kernels import linear as kl

    return kd.DOT_ROWS_KEY if kernel == "dot_rows" else kl.GEMV_KEY


def _block_m(configs: list[dict]) -> int | None:
    """The `gemv_rows` row block whose candidate list this is (each block's is its own), or None."""
    from tokenrouter.runtime.engine.kernels import linear as kl

    seen = _tiles(configs)
    return next((bm for bm, cfgs in kl._GEMV_FEW_CONFIGS.items() if _tiles(_as_dicts(cfgs)) == seen), None)


def _is_full_gemv(configs: list[dict]) -> bool:
    from tokenrouter.runtime.engine.kernels import linear as kl

    return _tiles(configs) == _tiles(_as_dicts(kl._GEMV_CONFIGS))


def _time(timing) -> tuple:
    """A candidate's time as the autotuner ranks it (its quantiles in order, the median first)."""
    return tuple(timing) if isinstance(timing, list) else (timing,)


def entry(path: Path, gpu: str) -> dict | None:
    """The table entry of one `<kernel>.autotune.json`, or None for a kernel or candidate list the engine's
    tables do not cover."""
    kernel = FILES.get(path.name.removesuffix(".autotune.json"))
    if kernel is None:
        return None
    data = json.loads(path.read_text())
    key, timed = data["key"], data["configs_timings"]
    configs = [c for c, _ in timed]
    names = _key_names(kernel)
    fields = dict(zip(names, key[: len(names)], strict=True))
    if kernel == "gemv" and not _is_full_gemv(configs):
        return None
    if kernel == "gemv_rows":
        block = _block_m(configs)
        if block is None:
            return None
        fields["BLOCK_M"] = block
    best, _ = min(timed, key=lambda ct: _time(ct[1]))
    config = dict(best["kwargs"], num_warps=best["num_warps"], num_stages=best["num_stages"])
    if best.get("maxnreg") is not None:
        config["maxnreg"] = best["maxnreg"]
    dtype = str(key[len(names)]).removeprefix("torch.")  # X's: the first tensor argument
    return dict(gpu=gpu, kernel=kernel, dtype=dtype, key=fields, config=config)


def collect(cache: Path, gpu: str) -> list[dict]:
    """Every covered entry under `cache`, checked as the engine checks a table's, in a stable order."""
    from tokenrouter.runtime.engine.kernels import dot_rows as kd

    out = []
    for path in sorted(cache.rglob("*.autotune.json")):
        e = entry(path, gpu)
        if e is not None:
            kd.check_tile_config(e["kernel"], e["config"])
            out.append(e)
    return sorted(out, key=lambda e: (e["kernel"], json.dumps(e["key"], sort_keys=True)))


def merge(table: dict, entries: list[dict]) -> int:
    """Add `entries` to `table` (its "entries") where it has none for the same GPU, kernel, dtype and key;
    returns how many were added."""
    have = {tuned_tiles._key(e["gpu"], e["kernel"], e["dtype"], e["key"]) for e in table["entries"]}
    added = [e for e in entries if tuned_tiles._key(e["gpu"], e["kernel"], e["dtype"], e["key"]) not in have]
    table["entries"].extend(added)
    return len(added)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, required=True, help="Triton's cache directory (TRITON_CACHE_DIR)")
    ap.add_argument("--gpu", help="the GPU model's name as torch reports it (default: this machine's GPU 0)")
    ap.add_argument("--out", type=Path, help="write the entries as a table file here")
    ap.add_argument("--into", type=Path, help="add the entries to this table file")
    args = ap.parse_args(argv)
    if not args.cache.is_dir():
        raise SystemExit(f"--cache {args.cache}: not a directory")
    gpu = args.gpu
    if gpu is None:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device here: name the GPU model with --gpu")
        gpu = torch.cuda.get_device_name(0)
    entries = collect(args.cache, gpu)
    counts = {k: sum(e["kernel"] == k for e in entries) for k in FILES.values()}
    print(f"{len(entries)} entries for {gpu}: " + ", ".join(f"{k} {n}" for k, n in counts.items()))
    if args.out:
        about = f"The Triton autotuner's picks on the {gpu} (bench/autotune_table.py)."
        args.out.write_text(json.dumps({"about": about, "entries": entries}, indent=1) + "\n")
    if args.into:
        table = json.loads(args.into.read_text())
        added = merge(table, entries)
        args.into.write_text(json.dumps(table, indent=1) + "\n")
        print(f"{added} added to {args.into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
