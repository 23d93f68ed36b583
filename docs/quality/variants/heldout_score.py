"""Score router files of examples/r2r_gain.tr on train-router's held-out split of all `router` positions.

Usage: PYTHONPATH=$PWD python docs/quality/variants/heldout_score.py SEED ROUTER.safetensors...

Reads the rows from .data/cache (written by the train-router commands of docs/quality.md, or teacher
forces them), splits them as `train-router --seed SEED` does, and prints the gaps recovered at 10 / 20 /
25 % as train-router's sweep does. For a router trained on other rows (e.g. the shipped one, trained on
a 400k sample), the held-out rows may be its training rows: the figure is then optimistic.
"""

import sys
from pathlib import Path

import torch

from tokenrouter.runtime.route.routers import RouterSpec, load_router
from tokenrouter.training.evaluate import Scorer, sweep_policy
from tokenrouter.training.feature_cache import teacher_force_cached
from tokenrouter.training.policy_view import load_plan, routed_shape, threshold_node
from tokenrouter.training.router_train import file_split
from tokenrouter.training.teacher import TeacherConfig, make_windows


def main() -> None:
    torch.set_num_threads(1)
    seed, files = int(sys.argv[1]), sys.argv[2:]
    plan = load_plan("examples/r2r_gain.tr")
    spec = RouterSpec.from_plan("gain", plan["routers"]["gain"])
    teacher = TeacherConfig(max_tokens=1_000_000)
    windows = make_windows(Path(".data/corpus/router"), Path(plan["models"]["slm"]["path"]), teacher)
    data, _ = teacher_force_cached(
        Path(".data/cache"), plan, "slm", ["slm", "llm"], windows, teacher, {"gain": spec}
    )
    held = data.subset(file_split(data, 0.15, seed))
    ir, n = plan["routes"]["slm"], held.n
    scorer = Scorer(held, "slm", routed_shape(plan).targets)
    node = threshold_node(plan, ir, "threshold")
    for f in files:
        router, _ = load_router(RouterSpec("gain", spec.kind, f, spec.inputs), None, "cpu")
        values = dict(held.features)
        values["uniform"] = torch.rand(n, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            values["gain"] = router(held.router_inputs["gain"])
        pts = [p for p, _ in sweep_policy(plan, "slm", values, n, node, (0.10, 0.20, 0.25), scorer)]
        acc = " / ".join(f"{100 * p['acc_gap_recovered']:.1f}" for p in pts)
        nll = " / ".join(f"{100 * p['nll_gap_recovered']:.1f}" for p in pts)
        print(f"seed {seed}, {n} held-out rows, {Path(f).stem}: accuracy {acc} %, NLL {nll} %", flush=True)


if __name__ == "__main__":
    main()
