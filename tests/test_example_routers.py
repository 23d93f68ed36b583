"""The shipped example policies' routers: each loads against its plan's models with the shape checks `serve` runs,
and the files stay small enough to travel with the tree (the ensemble router is stored in float16; the loader
computes in float32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokenrouter.compiler.driver import load_plan
from tokenrouter.runtime.route.routers import RouterSpec, load_router, model_hidden_size

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
POLICIES = [p for p in sorted(EXAMPLES.glob("*.tr")) if "router " in p.read_text()]


def test_the_shipped_routers_are_covered():
    assert {"r2r_gain_ens", "r2r_kd"} <= {p.stem for p in POLICIES}
    assert (EXAMPLES / "routers" / "py_r2r_gain_ens.safetensors").is_file()


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.stem)
def test_each_examples_routers_load_with_their_models_shapes(policy):
    plan = load_plan(policy, weights_check=False)  # citer's router is not shipped: it is trained by the user
    shipped = {n: e for n, e in plan["routers"].items() if Path(e["path"]).is_file()}
    for name, entry in shipped.items():
        spec = RouterSpec.from_plan(name, entry)
        hidden = model_hidden_size(plan["models"][spec.inputs[0].model]["path"])
        router, _ = load_router(spec, hidden, "cpu")
        assert all(w.dtype == torch.float32 and torch.isfinite(w).all() for w, _ in router.layers)
        assert Path(spec.path).stat().st_size < 6_000_000, f"{spec.path}: keep shipped routers under 6 MB"
