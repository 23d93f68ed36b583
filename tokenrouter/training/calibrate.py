"""A route threshold for a wanted share of hand-offs, found by generating with the plan itself.

A policy whose rule compares a feature or an untrained router against a threshold param (``r2r.tr``'s
``sigmoid(divergence) >= threshold``, ``r_stitch.tr``'s ``norm_entropy > threshold``) hands off at a rate
that depends on the models' weights: on the random-weight Qwen3 shapes of the serving matrix, r2r at its
default 0.5 sent 56 % of the tokens to the large model.

``calibrate_threshold`` loads the plan's models as the subservers would (same weights, same seed; eager, no
graphs), runs the in-process executor (the runtime's schedulers and hops; route kernels from the torch
renderer, whose decisions equal the Triton kernel's) on the prompts, greedy, and bisects the threshold until
the models other than the entry one write ``share`` of the tokens. The bracket comes from the entry model's
own route inputs over its solo generations (``entry_values``), which alone would be a poor estimate: on the
tiny random pair a threshold that fires on 10 % of the small model's solo positions hands off on 4 % when
served, since each rewrite changes the text that follows (solo runs repeat themselves, and a repeated
position that fires counts every time).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from .evaluate import bisect_share, compared_range, threshold_for_share
from .policy_view import PolicyViewError, threshold_node
from .teacher import router_input_values, step_features


@torch.no_grad()
def entry_values(plan: dict, engine, prompts: Sequence[Sequence[int]], max_new: int, seed: int = 0):
    """(values, n): the entry model's route inputs (features, `uniform()`, router outputs) at each position
    it generates alone (`engine`, loaded for the plan's entry model) from `prompts` (greedy, `max_new`
    tokens each, EOS ignored), as `eval_ir` reads them."""
    from tokenrouter.runtime.engine.generate import generate
    from tokenrouter.runtime.route.routers import RouterSpec, load_router
    from tokenrouter.runtime.sampling import SamplingParams

    entry = plan["entry"]
    device = engine.device
    params = [SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True, seed=seed)] * len(prompts)
    runs = generate(engine, [list(p) for p in prompts], params, rid_prefix="calibrate")
    specs = {r: RouterSpec.from_plan(r, plan["routers"][r]) for r in plan["routes"][entry]["routers"]}
    routers = {r: load_router(spec, None, device)[0] for r, spec in specs.items()}
    cols: dict[str, list[torch.Tensor]] = {}
    for prompt, run in zip(prompts, runs, strict=True):
        f = _run_values(engine, prompt, run.token_ids, specs, routers, seed)
        for k, v in f.items():
            cols.setdefault(k, []).append(v.cpu())
    values = {k: torch.cat(v) for k, v in cols.items()}
    return values, int(values["token"].shape[0])


def _run_values(
    engine, prompt: Sequence[int], generated: list[int], specs: dict, routers: dict, seed: int
) -> dict:
    """The route inputs at each generated position of one run (`entry_values`)."""
    from tokenrouter.runtime.rng import STREAM_UNIFORM, uniform

    ids = [*prompt, *generated]
    logits, hidden = engine.forward_full(ids[:-1])  # row t: after reading ids[0..t]
    rows = slice(len(prompt) - 1, len(ids) - 1)  # the rows that chose a generated token
    f = step_features(logits[rows].float())
    t = torch.arange(len(ids) - 1, device=logits.device)[rows]
    f.update(position=t + 2, generated=t + 2 - len(prompt), run_length=t + 2 - len(prompt))
    f["uniform"] = uniform(torch.full_like(t, seed), t + 1, STREAM_UNIFORM, torch.zeros_like(t))
    for r, spec in specs.items():
        xs = router_input_values(spec, logits[rows], hidden[rows], f["token"], engine.embed)
        f[r] = routers[r](xs.to(engine.device)).flatten()
    return f


# A threshold whose solo share moves from half the wanted share to 1.5 times it within this fraction of its
# own size is called too narrow to hold once served. On the random-weight Qwen3 shapes r_stitch's normalized
# entropies all lie near 0.98290 and the 10 % threshold moved by 5e-6 between the solo and the in-process
# estimate; served on the H200 it handed off 15-27 % instead of 10 %.
NARROW = 1e-4


def resolution(ir: dict, values: dict, n: int, node: int, share: float, bounds) -> float:
    """How far the threshold moves while the entry model's rules go from firing on share / 2 of its solo
    positions to 1.5 x share (at most all of them): the resolution a calibrated threshold has to hold."""
    lo, _, _ = threshold_for_share(ir, values, n, node, share / 2, bounds)
    hi, _, _ = threshold_for_share(ir, values, n, node, min(1.5 * share, 1.0), bounds)
    return abs(hi - lo)


def resolution_warning(param: str, share: float, threshold: float, width: float) -> str | None:
    """A message when `width` (`resolution`) is under NARROW of the threshold's size, else None."""
    if width >= NARROW * max(abs(threshold), 1e-2):
        return None
    return (
        f"the entry model's positions go from firing on {share / 2:g} to {min(1.5 * share, 1.0):g} of the time "
        f"within {width:.3g} of {param} = {threshold:.6g}: at that resolution the decision follows the "
        "rounding of the kernels, and a server (CUDA graphs, other batch sizes) may hand off another share"
    )


def with_threshold(plan: dict, param: str, value: float) -> dict:
    """A copy of `plan` with `param` set to `value` where it was folded in: the one comparison per route
    block that compares against it (`threshold_node`; r_stitch has one in each model's block)."""
    out = copy.deepcopy(plan)
    found = 0
    for ir in out["routes"].values():
        try:
            node = threshold_node(out, ir, param)
        except PolicyViewError as e:
            if "more than one" in str(e):
                raise
            continue
        ir["nodes"][node]["value"] = value
        found += 1
    if not found:
        threshold_node(out, out["routes"][out["entry"]], param)  # its message says why
    out["params"][param]["value"] = value
    return out


def routed_share(executor, plan: dict, prompts, max_new: int) -> float:
    """The share of generated tokens that models other than the entry one write when `executor` (an
    OfflineExecutor for `plan`) serves `prompts` greedily."""
    from tokenrouter.runtime import messages as m

    results = executor.generate(
        [list(p) for p in prompts],
        m.SamplingSpec(temperature=0.0, max_tokens=max_new, seed=0, ignore_eos=True),
    )
    writers = [w for r in results for w in r.models]
    return sum(w != plan["entry"] for w in writers) / max(len(writers), 1)


def calibrate_threshold(
    plan: dict,
    param: str,
    share: float,
    prompts: Sequence[Sequence[int]],
    max_new: int,
    device: str | None = None,
    iterations: int = 10,
) -> dict:
    """{"threshold", "share" (reached, served), "positions", "solo_threshold", "solo_share", "solo_width"
    [, "warning"]}: the value of `param` at which the plan, served greedily on `prompts`, has the other
    models write about `share` of the tokens (bisection, `iterations` routed generations); "solo_*": the
    threshold at which the entry model's rules fire on `share` of its solo positions, the served share at
    it, and its `resolution` (with a "warning" when that is under NARROW of the threshold). PolicyViewError (a
    message for users) when the param is not one side of one comparison or the share does not move."""
    from tokenrouter.progress import Progress
    from tokenrouter.runtime.engine.embedded import device_scope

    if not 0.0 < share < 1.0:
        raise ValueError(f"share must be in (0, 1), got {share}")
    ir = plan["routes"][plan["entry"]]
    node = threshold_node(plan, ir, param)
    devices, engines = _load_engines(plan, device)
    entry = plan["entry"]
    progress = Progress("calibrate", None, "routed generations")
    with device_scope(devices[entry]):  # the last model loaded (maybe on another GPU) is the current device
        values, n = entry_values(plan, engines[entry], prompts, max_new)
    progress.update(0, f"the entry model alone: {n} positions")
    if n == 0:
        raise PolicyViewError("no generated positions to calibrate on")
    bounds = compared_range(ir, values, n, node)
    solo, _, _ = threshold_for_share(ir, values, n, node, share, bounds)
    width = resolution(ir, values, n, node, share, bounds)
    served = _Served(plan, param, engines, prompts, max_new, progress)
    stuck = f"the served share does not move with {param!r}"
    _, _, tried = bisect_share(served, *bounds, share, iterations, stuck)
    best = min(tried, key=lambda v: abs(tried[v] - share))
    out = {"threshold": best, "share": tried[best], "positions": n, "solo_threshold": solo,
           "solo_share": served(solo), "solo_width": width}  # fmt: skip
    progress.finish(served.runs)
    warning = resolution_warning(param, share, best, width)
    if warning:
        out["warning"] = warning
    engines.clear()  # their KV pools and weights, before the caller starts the subservers
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def _load_engines(plan: dict, device: str | None) -> tuple[dict[str, str], dict]:
    """Each model's device (as `serve` places them, or `device`) and its engine, loaded without CUDA graphs."""
    from tokenrouter.runtime import threads
    from tokenrouter.runtime.subserver.loading import load_model_engine, pick_device

    threads.set_torch_threads(len(plan["models"]))
    devices = {name: pick_device(spec, device) for name, spec in plan["models"].items()}  # as `serve` does
    engines = {
        name: load_model_engine(plan, name, devices[name], cuda_graph=False) for name in plan["models"]
    }
    return devices, engines


class _Served:
    """The share the other models write when the plan, with `param` at a value, serves the prompts greedily
    (one routed generation per call, counted in `runs` and reported to `progress`)."""

    def __init__(self, plan: dict, param: str, engines: dict, prompts, max_new: int, progress) -> None:
        self.plan, self.param, self.engines = plan, param, engines
        self.prompts, self.max_new, self.progress = prompts, max_new, progress
        self.runs = 0

    def __call__(self, v: float) -> float:
        from tokenrouter.runtime.offline import OfflineExecutor
        from tokenrouter.runtime.route import RouteKernel

        p = with_threshold(self.plan, self.param, v)
        kernels = {name: RouteKernel(p, name, "torch", e.device, e.embed) for name, e in self.engines.items()}
        got = routed_share(OfflineExecutor(p, self.engines, kernels), p, self.prompts, self.max_new)
        self.runs += 1
        self.progress.update(self.runs, f"{self.param} {v:.4g}: share {got:.3f}")
        return got
