"""Each model's share of its GPU (`mem`) where the plan leaves it out: weights plus KV, the KV split by need.

A request's tokens live in the KV of every model it visits, so every model of a plan needs KV for the same
requests: the plan's concurrency N, each up to the model's longest sequence L (`max_len`, else its config's
`max_position_embeddings`). Model i's need is N × L_i × its bytes per token (K and V of every layer). The
memory of a GPU the models may use is its total × MEM_HEADROOM (the rest: activations, CUDA graphs, the CUDA
context), less the shares given in the plan; from it the weights of the models without `mem` are taken first,
and what is left goes to their KV in proportion to their needs (as joint KV allocation does: each model gets
the same fraction of its need, so every model holds the same number of requests' tokens). The share is the
model's weights plus its KV over the usable memory, the `mem` the subserver turns back into a KV budget
(`subserver/loading.py`: `mem × total × MEM_HEADROOM − weights`).

A plan whose KV left after the weights cannot hold one sequence of L_i tokens on every model does not fit: a
`MemoryFitError` names the numbers. Weights are counted from the safetensors headers (the tensors' element
counts, in the plan's dtype), else from config.json (a folder without weights, `load: dummy`).

`model_need(spec)` reads a model's folder; `share_memory(needs, concurrency, gpu_totals)` is the pure
computation; `size_plan(...)` is `serve`'s step: the plan with every missing `mem` filled and one line per model
saying what was chosen and why.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tokenrouter.runtime.subserver.loading import MEM_HEADROOM

GIB = 1 << 30
_WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2}
_HEADER_MAX = 100 << 20  # a safetensors header longer than this is not one


class MemoryFitError(ValueError):
    """The plan's models do not fit their GPU; the message names the numbers."""


@dataclass(frozen=True, slots=True)
class ModelNeed:
    """What one model of a plan asks of its GPU."""

    gpu: int
    weight_bytes: int
    kv_bytes_per_token: int
    max_len: int  # its longest sequence (the plan's max_len, capped by the config's max_position_embeddings)
    mem: float | None = None  # the plan's share, where given


@dataclass(frozen=True, slots=True)
class Share:
    """A model's share of its GPU and how it was arrived at."""

    model: str
    gpu: int
    mem: float  # of the GPU's total memory
    given: bool  # the plan's `mem`, kept
    gpu_total: int
    weight_bytes: int
    kv_bytes: int  # what the share leaves for KV after the weights
    kv_tokens: int
    concurrency: int
    max_len: int

    @property
    def need_tokens(self) -> int:
        return self.concurrency * self.max_len

    def line(self) -> str:
        """One line for `serve`'s start-up output."""
        head = f"model {self.model}: mem {self.mem:.3f} of GPU {self.gpu} ({_gib(self.gpu_total)})"
        if self.given:
            head += ", as the plan gives"
        kv = f"weights {_gib(self.weight_bytes)} + KV {_gib(self.kv_bytes)} = {self.kv_tokens:,} tokens"
        ratio = self.kv_tokens / self.need_tokens
        need = f"{self.concurrency} requests × max_len {self.max_len:,}"
        if ratio >= 1:
            why = f"{ratio:.1f}× the {self.need_tokens:,} that {need} need"
        else:
            why = (
                f"{ratio:.0%} of the {self.need_tokens:,} that {need} need: requests may wait "
                "for KV (a smaller max_len or concurrency avoids it)"
            )
        if not self.given:
            why += "; the KV left after the weights, split by need"
        return f"{head}: {kv}, {why}"


def share_memory(
    needs: dict[str, ModelNeed], concurrency: int, gpu_totals: dict[int, int], headroom: float = MEM_HEADROOM
) -> dict[str, Share]:
    """Every model's share (the module doc): a given `mem` is kept, the others are computed per GPU.
    `gpu_totals`: bytes of memory per GPU index. A MemoryFitError where they cannot fit."""
    out: dict[str, Share] = {}
    for gpu in sorted({n.gpu for n in needs.values()}):
        if gpu not in gpu_totals:
            raise MemoryFitError(f"GPU {gpu}: no memory total known for it (GPUs: {sorted(gpu_totals)})")
        on_gpu = {name: n for name, n in needs.items() if n.gpu == gpu}
        out.update(_share_gpu(on_gpu, concurrency, gpu, gpu_totals[gpu], headroom))
    return {name: out[name] for name in needs}


def _share_gpu(
    needs: dict[str, ModelNeed], concurrency: int, gpu: int, total: int, headroom: float
) -> dict[str, Share]:
    usable = total * headroom
    where = (gpu, total, usable, concurrency)
    out = {name: _share(name, n, n.mem, True, where) for name, n in needs.items() if n.mem is not None}
    auto = {name: n for name, n in needs.items() if n.mem is None}
    if not auto:
        return out
    given = sum(n.mem for n in needs.values() if n.mem is not None)
    room = (1.0 - given) * usable  # bytes for the weights and KV of the models without `mem`
    weights = sum(n.weight_bytes for n in auto.values())
    kv_room = room - weights
    need = {name: concurrency * n.max_len * n.kv_bytes_per_token for name, n in auto.items()}
    least = {name: n.max_len * n.kv_bytes_per_token for name, n in auto.items()}  # one full-length sequence
    total_need = sum(need.values())
    if kv_room < sum(least.values()):
        raise MemoryFitError(_misfit(auto, gpu, total, headroom, given, room, weights, least))
    for name, n in auto.items():
        kv = kv_room * need[name] / total_need
        out[name] = _share(name, n, (n.weight_bytes + kv) / usable, False, where)
    return out


def _share(name: str, n: ModelNeed, mem: float, given: bool, where: tuple[int, int, float, int]) -> Share:
    """Model `name`'s share `mem` of a GPU; `where`: (the GPU, its bytes, the bytes usable, the concurrency)."""
    gpu, total, usable, concurrency = where
    kv = max(int(mem * usable) - n.weight_bytes, 0)
    return Share(name, gpu, mem, given, total, n.weight_bytes, kv, kv // n.kv_bytes_per_token,
                 concurrency, n.max_len)  # fmt: skip


def _misfit(auto, gpu, total, headroom, given, room, weights, least) -> str:
    def each(values: dict[str, float]) -> str:
        return ", ".join(f"{name} {_gib(v)}" for name, v in values.items())

    kept = f", less {given:.3f} given as `mem` to other models" if given else ""
    return (
        f"the plan does not fit GPU {gpu}: of its {_gib(total)}, {_gib(room)} are for the models without `mem` "
        f"({headroom:.0%} of it{kept}); their weights take {_gib(weights)} ({each({k: n.weight_bytes for k, n in auto.items()})}), "
        f"leaving {_gib(max(room - weights, 0))} for KV, but one sequence of max_len tokens on each needs "
        f"{_gib(sum(least.values()))} ({each(least)}). Give the models a smaller `max_len`, place them on "
        "other GPUs, or give their `mem` in the plan"
    )


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


# ---- reading a model folder -----------------------------------------------------------------------------


def safetensors_elements(folder: str | Path) -> int | None:
    """The element count of every tensor in the folder's *.safetensors files, from their headers alone (None:
    no such file)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    count = 0
    for path in files:
        try:
            count += _header_elements(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error) as e:
            raise MemoryFitError(f"{path}: not a readable safetensors file ({e})") from None
    return count


def _header_elements(path: Path) -> int:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > _HEADER_MAX:
            raise ValueError(f"a header of {size} bytes")
        header = json.loads(f.read(size))
    return sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")


def model_need(spec: dict) -> ModelNeed:
    """A plan's model entry's need: its config, its weights counted from safetensors headers (else the
    config's parameter count), in the plan's dtype."""
    from tokenrouter.runtime.engine.config import ModelFolderError, load_model_config

    try:
        config = load_model_config(spec["path"])
    except ModelFolderError as e:
        raise MemoryFitError(str(e)) from None
    width = _WIDTH.get(spec.get("dtype") or "bfloat16", 2)
    elements = None if spec.get("load") == "dummy" else safetensors_elements(spec["path"])
    longest = config.max_position_embeddings
    return ModelNeed(
        gpu=(spec.get("gpus") or [0])[0],
        weight_bytes=(elements if elements is not None else config.num_params()) * width,
        kv_bytes_per_token=2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * config.head_dim
        * width,
        max_len=min(spec["max_len"], longest) if spec.get("max_len") else longest,
        mem=spec.get("mem"),
    )


def cuda_totals() -> dict[int, int] | None:
    """Bytes of memory per visible CUDA device, from the driver (`cuda_info`: torch is not imported); None where
    there is none."""
    from tokenrouter.runtime.cuda_info import device_memory

    return dict(enumerate(device_memory())) or None


def size_plan(
    plan: dict,
    models: list[str],
    totals: Callable[[], dict[int, int] | None] = cuda_totals,
    say: Callable[[str], None] = print,
) -> dict | None:
    """`serve`'s sizing: where a model of `models` (the local ones) has no `mem` and a GPU is here, a copy of
    the plan with the `mem` of every model of `models` filled (share_memory), and a line per model through
    `say`. None where nothing is to be done (every `mem` given, or no GPU)."""
    if all(plan["models"][x].get("mem") is not None for x in models):
        return None
    gpus = totals()
    if not gpus:
        return None
    needs = {x: model_need(plan["models"][x]) for x in models}
    shares = share_memory(needs, int(plan["serve"]["concurrency"]), gpus)
    for s in shares.values():
        say(s.line())
    out = {**plan, "models": {x: dict(spec) for x, spec in plan["models"].items()}}
    for x, s in shares.items():
        # rounded down, so that the shares of one GPU never add up to more than its memory
        out["models"][x]["mem"] = s.mem if s.given else math.floor(s.mem * 1e6) / 1e6
    return out


def serve_sizing(
    plan: dict, plan_path: str, run_dir: Path, models: list[str], totals=cuda_totals
) -> tuple[dict, str]:
    """`tokenrouter serve`'s step: (plan, path) with the `mem` of `models` filled where it was missing and a GPU
    is here (the plan written into `run_dir` for the subservers), each share told on stderr; else as given."""
    from tokenrouter.compiler.plan import write_plan

    sized = size_plan(
        plan, models, totals, say=lambda line: print(f"tokenrouter: {line}", file=sys.stderr, flush=True)
    )
    if sized is None:
        return plan, plan_path
    path = Path(run_dir) / "plan-sized.json"
    write_plan(sized, path)
    return sized, str(path)


__all__ = ["MemoryFitError", "ModelNeed", "Share", "model_need", "serve_sizing", "share_memory", "size_plan"]
