"""Tile configs of the linear kernels measured fastest inside the CUDA graph step, per GPU model.

Triton's autotuner times each candidate config of a kernel alone, back to back. Inside a captured step the
kernels run under programmatic dependent launch, each overlapping the one before, and there the fastest
config can be another one: on the H200, `bench/graph_tune.py` found configs for the Qwen3-0.6B's `dot_rows`
layers that make its one-request extends 0.82x (ctx 512) and 0.90x (ctx 4096) as long as with the
autotuner's picks, and for its one-token GEMV configs that make the decode bs 1 0.90x / 0.92x as long
as one process's autotuner picks (whose picks, and the step, varied by machine).
A table also spares a fresh machine the autotuning itself: a launch with an entry builds one config, not every
candidate, and times none. For GPU models without tuning in the graph, the shipped table holds the autotuner's
own picks of a start (`bench/autotune_table.py` reads them from Triton's cache), so that a fresh machine of that
model builds only those. `dot_rows`, `gemv` and `gemv_rows` read the tables. This module holds such configs: `tuned_tiles.json` beside it
(shipped, measured on the GPUs it names) and, where the engine's tuning names them (`EngineTuning.
tuned_tiles_files`, applied by `use_files` when a Triton backend is built: the tables are the process's),
tables that `bench/graph_tune.py --table FILE` wrote on another GPU (their entries take precedence, a later
file's over an earlier one's). A kernel launch with no entry for its GPU model, dtype and tuning key keeps
the autotuner's choice. `EngineTuning.tuned_tiles` (on by default) decides whether the tables are read.

An entry: {"gpu": torch.cuda.get_device_name(), "kernel": "dot_rows", "dtype": "bfloat16", "key": {the
autotuner's key: N, K and the kernel's variant flags}, "config": {the kernel's tile meta-parameters,
"num_warps", "num_stages"}}.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

SHIPPED = Path(__file__).with_name("tuned_tiles.json")
_CONFIG_FIELDS = {"num_warps", "num_stages"}


def _key(gpu: str, kernel: str, dtype: str, key: dict) -> tuple:
    return (gpu, kernel, dtype, tuple(sorted((k, v) for k, v in key.items())))


def read_table(path: Path) -> dict[tuple, dict]:
    """The entries of one table file, by (gpu, kernel, dtype, key); ValueError naming the file and what is
    wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read the tuned tile table ({e.strerror or e})") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from e
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected an object with a list of 'entries'")
    table = {}
    for i, e in enumerate(entries):
        if not _entry_ok(e):
            raise ValueError(
                f"{path}: entry {i} needs 'gpu', 'kernel', 'dtype' (strings), 'key' (an object) and 'config' "
                "(integer tile parameters with num_warps and num_stages)"
            )
        table[_key(e["gpu"], e["kernel"], e["dtype"], e["key"])] = dict(e["config"])
    return table


def _entry_ok(e: object) -> bool:
    """Whether a table entry has the fields `read_table` needs, of the right types."""
    return (
        isinstance(e, dict)
        and all(isinstance(e.get(f), str) for f in ("gpu", "kernel", "dtype"))
        and isinstance(e.get("key"), dict)
        and isinstance(e.get("config"), dict)
        and _CONFIG_FIELDS <= set(e["config"])
        and all(isinstance(v, int) for v in e["config"].values())
    )


@functools.lru_cache(maxsize=4)
def _files(extra: tuple[str, ...]) -> tuple[tuple[Path, dict[tuple, dict]], ...]:
    """(path, entries) of the shipped table and of the `extra` files."""
    paths = [SHIPPED, *(Path(part) for part in extra)]
    return tuple((path, read_table(path)) for path in paths)


@functools.lru_cache(maxsize=4)
def _tables(extra: tuple[str, ...]) -> dict[tuple, dict]:
    """Every entry, a later file's over an earlier one's and the files' over the shipped ones."""
    table: dict[tuple, dict] = {}
    for _, entries in _files(extra):
        table.update(entries)
    return table


_extra: tuple[str, ...] = ()  # the files `use_files` set, read after the shipped table


def use_files(files: tuple[str, ...], check_config) -> None:
    """Read the shipped table and `files` now, pass every entry to `check_config(kernel, config)` (ValueError
    naming a bad file, or the file and entry that `check_config` rejects), then look configs up in them: the
    Triton attention backend calls this when it is built, with its tuning's files and the kernels' check."""
    global _extra
    files = tuple(files)
    for path, entries in _files(files):
        for (gpu, kernel, dtype, key), config in entries.items():
            try:
                check_config(kernel, config)
            except ValueError as e:
                raise ValueError(f"{path}: the entry for {kernel} on {gpu}, {dtype}, {dict(key)}: {e}") from e
    _extra = files


@functools.lru_cache(maxsize=16)
def gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device)


def lookup(kernel: str, device: torch.device, dtype: torch.dtype, **key) -> dict | None:
    """The tuned config (tile meta-parameters, num_warps, num_stages) of `kernel` for this GPU model, dtype
    and tuning key, or None (then the autotuner chooses)."""
    if device.type != "cuda":
        return None
    cfg = _tables(_extra).get(_key(gpu_name(device), kernel, str(dtype).removeprefix("torch."), key))
    return dict(cfg) if cfg is not None else None


def covers(kernel: str, device: torch.device, dtype: torch.dtype, **fields) -> bool:
    """Whether the tables hold any `kernel` entry for this GPU model and dtype whose key has `fields` (e.g.
    BLOCK_X=32: tiles for `dot_rows`' 32-row block)."""
    if device.type != "cuda":
        return False
    gpu, want = gpu_name(device), str(dtype).removeprefix("torch.")
    return any(
        g == gpu and k == kernel and d == want and all(dict(key).get(f) == v for f, v in fields.items())
        for g, k, d, key in _tables(_extra)
    )
