"""Learned routers (`linear`, `mlp`): the safetensors layout of docs/ir.md, loading with shape checks,
their inputs, and untrained files of the right shape (`tokenrouter init-router`).

Weights load from safetensors only; nothing on this path unpickles. Every error names the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

ROUTER_FORMAT = "tokenrouter.router/1"
ROUTER_KINDS = ("linear", "mlp")
INPUT_KINDS = ("hidden", "topk_logits", "topk_logprobs", "embedding")


class RouterFileError(ValueError):
    """A router file that is missing, unreadable or does not fit the router's inputs."""


@dataclass(slots=True, frozen=True)
class RouterInput:
    kind: str  # hidden | topk_logits | topk_logprobs | embedding
    model: str
    k: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in INPUT_KINDS:
            raise ValueError(f"unknown router input {self.kind!r}; expected one of {', '.join(INPUT_KINDS)}")
        if self.kind.startswith("topk_") and (not isinstance(self.k, int) or self.k < 1):
            raise ValueError(f"router input {self.kind} needs k >= 1, got {self.k!r}")

    def width(self, hidden_size: int) -> int:
        return self.k if self.kind.startswith("topk_") else hidden_size

    def text(self) -> str:
        if self.kind.startswith("topk_"):
            return f"{self.kind}({self.model}, {self.k})"
        if self.kind == "embedding":
            return f"embedding({self.model}, token)"
        return f"hidden({self.model})"


@dataclass(slots=True, frozen=True)
class RouterSpec:
    """One router of a plan (`plan["routers"][name]`), checked."""

    name: str
    kind: str
    path: str
    inputs: tuple[RouterInput, ...]

    @classmethod
    def from_plan(cls, name: str, entry: dict) -> RouterSpec:
        if not isinstance(entry, dict):
            raise ValueError(f"router {name!r}: plan entry must be an object")
        kind = entry.get("kind")
        if kind not in ROUTER_KINDS:
            raise ValueError(f"router {name!r}: kind must be one of {', '.join(ROUTER_KINDS)}, got {kind!r}")
        path = entry.get("path")
        if not isinstance(path, str) or not path:
            raise ValueError(f"router {name!r}: 'path' must be a non-empty string")
        raw_inputs = entry.get("inputs")
        if not isinstance(raw_inputs, list) or not raw_inputs:
            raise ValueError(f"router {name!r}: 'inputs' must be a non-empty list")
        inputs = []
        for raw in raw_inputs:
            if not isinstance(raw, dict):
                raise ValueError(f"router {name!r}: each input must be an object, got {raw!r}")
            inputs.append(RouterInput(raw.get("kind"), str(raw.get("model")), raw.get("k")))
        return cls(name, kind, path, tuple(inputs))

    @property
    def hidden_inputs(self) -> int:
        return sum(1 for i in self.inputs if i.kind in ("hidden", "embedding"))

    @property
    def fixed_width(self) -> int:
        return sum(i.k for i in self.inputs if i.kind.startswith("topk_"))

    def width(self, hidden_size: int) -> int:
        return sum(i.width(hidden_size) for i in self.inputs)

    def inputs_text(self) -> str:
        return ", ".join(i.text() for i in self.inputs)


class Router:
    """A loaded router: float32 layers on one device. `__call__(x [B, D]) -> [B]` (the raw output)."""

    def __init__(
        self,
        spec: RouterSpec,
        layers: list[tuple[torch.Tensor, torch.Tensor]],
        mean: torch.Tensor | None,
        std: torch.Tensor | None,
    ) -> None:
        self.spec = spec
        self.layers = layers
        self.mean = mean
        self.std = std

    @property
    def in_features(self) -> int:
        return self.layers[0][0].shape[1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        if self.mean is not None:
            x = (x - self.mean) / self.std
        last = len(self.layers) - 1
        for i, (w, b) in enumerate(self.layers):
            x = torch.addmm(b, x, w.t())
            if i < last:
                x = torch.relu(x)
        return x[:, 0]


def _layer_names(kind: str, tensors: dict) -> list[tuple[str, str]]:
    if kind == "linear":
        return [("weight", "bias")]
    count = 0
    while f"layers.{count}.weight" in tensors:
        count += 1
    return [(f"layers.{i}.weight", f"layers.{i}.bias") for i in range(count)]


def check_router_tensors(
    spec: RouterSpec, tensors: dict[str, torch.Tensor], where: str, hidden_size: int | None
) -> int:
    """Check the layout of docs/ir.md; return the hidden size the file implies. Raises RouterFileError."""

    def fail(msg: str) -> RouterFileError:
        return RouterFileError(
            f"{where}: router {spec.name!r} ({spec.kind}, inputs {spec.inputs_text()}): {msg}"
        )

    names = _layer_names(spec.kind, tensors)
    if not names:
        raise fail("no layers: expected tensors 'layers.0.weight', 'layers.0.bias', ...")
    known = {n for pair in names for n in pair} | {"input_mean", "input_std"}
    extra = sorted(set(tensors) - known)
    if extra:
        raise fail(f"unexpected tensors {extra}")
    _check_layers(names, tensors, fail)
    d = tensors[names[0][0]].shape[1]
    for extra_name in ("input_mean", "input_std"):
        if extra_name in tensors and list(tensors[extra_name].shape) != [d]:
            raise fail(f"{extra_name} must be [{d}], got {list(tensors[extra_name].shape)}")
    if ("input_mean" in tensors) != ("input_std" in tensors):
        raise fail("input_mean and input_std come together")
    return _check_input_width(spec, d, hidden_size, fail)


def _check_layers(names: list[tuple[str, str]], tensors: dict[str, torch.Tensor], fail) -> None:
    """Each layer's weight [out, in] and bias [out], floating point, each taking the layer before's outputs,
    the last giving one."""
    prev = None
    for w_name, b_name in names:
        if w_name not in tensors or b_name not in tensors:
            raise fail(f"missing {w_name!r} or {b_name!r}")
        w, b = tensors[w_name], tensors[b_name]
        if not (w.is_floating_point() and b.is_floating_point()):
            raise fail(f"{w_name} and {b_name} must be floating point")
        if w.dim() != 2 or b.dim() != 1 or b.shape[0] != w.shape[0]:
            raise fail(
                f"{w_name} must be [out, in] and {b_name} [out]; got {list(w.shape)} and {list(b.shape)}"
            )
        if prev is not None and w.shape[1] != prev:
            raise fail(f"{w_name} takes {w.shape[1]} inputs but the layer before gives {prev}")
        prev = w.shape[0]
    if prev != 1:
        raise fail(f"the last layer must have 1 output, got {prev}")


def _check_input_width(spec: RouterSpec, d: int, hidden_size: int | None, fail) -> int:
    """The first layer's D inputs are the router's inputs at `hidden_size` (None: the one D implies, returned)."""
    if hidden_size is None:
        rest = d - spec.fixed_width
        n = spec.hidden_inputs
        if (n == 0 and rest != 0) or (n > 0 and (rest <= 0 or rest % n)):
            raise fail(f"the first layer takes D = {d} inputs, which fits no hidden size for these inputs")
        hidden_size = rest // n if n else 0
    want = spec.width(hidden_size)
    if d != want:
        raise fail(
            f"the first layer takes D = {d} inputs, but the inputs give {want} "
            f"(hidden_size {hidden_size}, widths in order: {[i.width(hidden_size) for i in spec.inputs]})"
        )
    return hidden_size


def check_router_digests(plan: dict, model: str) -> None:
    """Every router file that `model` reads holds what the plan was compiled with: a RouterFileError naming both
    sha256 digests when one was swapped or retrained since (a plan compiled without the file has no digest)."""
    for name, entry in (plan.get("routers") or {}).items():
        want = entry.get("sha256") if isinstance(entry, dict) else None
        if entry.get("model") != model or not want or not Path(entry["path"]).is_file():
            continue
        h = hashlib.sha256()
        with open(entry["path"], "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != want:
            raise RouterFileError(
                f"{entry['path']}: router {name!r} has sha256 {h.hexdigest()}, but the plan was compiled with "
                f"sha256 {want}; compile the policy again to serve this file"
            )


def load_router(spec: RouterSpec, hidden_size: int | None, device: torch.device | str) -> tuple[Router, int]:
    """Load and shape-check one router file; return it on `device` and the hidden size it implies."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(spec.path)
    if not path.is_file():
        raise RouterFileError(
            f"{path}: router {spec.name!r} weights not found (train them with "
            f"`tokenrouter train-router POLICY {spec.name}`)"
        )
    try:
        tensors = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise RouterFileError(
            f"{path}: router {spec.name!r}: not a readable safetensors file ({exc})"
        ) from None
    hidden_size = check_router_tensors(spec, tensors, str(path), hidden_size)
    layers = [
        (tensors[w].to(device, torch.float32).contiguous(), tensors[b].to(device, torch.float32).contiguous())
        for w, b in _layer_names(spec.kind, tensors)
    ]
    mean = tensors["input_mean"].to(device, torch.float32) if "input_mean" in tensors else None
    std = tensors["input_std"].to(device, torch.float32) if "input_std" in tensors else None
    return Router(spec, layers, mean, std), hidden_size


def untrained_router_tensors(
    kind: str, in_features: int, hidden_layers: tuple[int, ...] = (256,), seed: int = 0
) -> dict[str, torch.Tensor]:
    """Randomly initialised weights (uniform ±1/sqrt(fan_in), zero biases) of the docs/ir.md layout."""
    if kind not in ROUTER_KINDS:
        raise ValueError(f"router kind must be one of {', '.join(ROUTER_KINDS)}, got {kind!r}")
    if in_features < 1:
        raise ValueError(f"a router needs at least one input feature, got D = {in_features}")
    if any(h < 1 for h in hidden_layers):
        raise ValueError(f"hidden layer sizes must be >= 1, got {list(hidden_layers)}")
    gen = torch.Generator().manual_seed(seed)
    sizes = [in_features, 1] if kind == "linear" else [in_features, *hidden_layers, 1]
    out: dict[str, torch.Tensor] = {}
    for i in range(len(sizes) - 1):
        bound = 1.0 / math.sqrt(sizes[i])
        w = (torch.rand(sizes[i + 1], sizes[i], generator=gen) * 2 - 1) * bound
        prefix = "" if kind == "linear" else f"layers.{i}."
        out[prefix + "weight"] = w
        out[prefix + "bias"] = torch.zeros(sizes[i + 1])
    return out


def write_router(path: str | os.PathLike, spec: RouterSpec, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    metadata = {"format": ROUTER_FORMAT, "kind": spec.kind, "inputs": spec.inputs_text()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)


def model_hidden_size(model_path: str) -> int | None:
    """hidden_size from a local HF-format folder's config.json, or None when there is none to read."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{config}: cannot read the model config ({exc})") from None
    for source in (data, data.get("text_config") or {}):
        value = source.get("hidden_size") if isinstance(source, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"{config}: no positive integer 'hidden_size'")


_HIDDEN_LAYERS = re.compile(r"\s*\d+\s*(,\s*\d+\s*)*\Z")


def parse_hidden_layers(text: str) -> tuple[int, ...]:
    """'256,128' -> (256, 128); raises ValueError with a message otherwise."""
    if not _HIDDEN_LAYERS.match(text):
        raise ValueError(f"hidden layer sizes must be a comma-separated list of integers, got {text!r}")
    sizes = tuple(int(p) for p in text.split(","))
    if any(s < 1 for s in sizes):
        raise ValueError(f"hidden layer sizes must be >= 1, got {text!r}")
    return sizes


def _plan_hidden_size(plan: dict, name: str, model: str) -> int:
    """The hidden size of the plan's `model`, which router `name` reads; a ValueError for users if unknown."""
    path = ((plan.get("models") or {}).get(model) or {}).get("path")
    hidden_size = model_hidden_size(path) if isinstance(path, str) else None
    if hidden_size is None:
        raise ValueError(
            f"router {name!r} reads hidden()/embedding() of model {model!r}, whose hidden_size is unknown: "
            f"{path!r} is not a local folder with a config.json; pass --hidden-size"
        )
    return hidden_size


def init_router_file(
    plan: dict,
    name: str,
    out: str | os.PathLike,
    *,
    seed: int = 0,
    hidden_layers: tuple[int, ...] = (256,),
    hidden_size: int | None = None,
) -> tuple[RouterSpec, int]:
    """Write an untrained router file for `plan["routers"][name]`; return its spec and input width D.
    The hidden size comes from `hidden_size`, else the model's config.json. Raises ValueError for users."""
    routers = plan.get("routers") or {}
    if name not in routers:
        known = ", ".join(sorted(routers)) or "none"
        raise ValueError(f"the plan has no router {name!r} (routers: {known})")
    spec = RouterSpec.from_plan(name, routers[name])
    if spec.hidden_inputs and hidden_size is None:
        hidden_size = _plan_hidden_size(plan, name, spec.inputs[0].model)
    width = spec.width(hidden_size or 0)
    tensors = untrained_router_tensors(spec.kind, width, hidden_layers, seed)
    write_router(out, spec, tensors)
    return spec, width
