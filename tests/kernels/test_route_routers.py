"""Learned routers: the safetensors layout, init-router, loading with shape checks, and router outputs
against an independent float64 computation."""

from __future__ import annotations

import json

import pytest
import torch
from route_cases import with_router
from route_inputs import mixed_state, random_logits
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.runtime.route import RouteKernel, RouteKernelError, RouterFileError
from tokenrouter.runtime.route.routers import RouterSpec, untrained_router_tensors, write_router

POLICY = """policy p "router test"
model slm = "small" { gpu: 0 }
model llm = "large" { gpu: 0 }
router gate = KIND("gate.safetensors", hidden(slm), topk_logits(slm, 5), topk_logprobs(slm, 3), embedding(slm, token))
entry slm
route slm {
  when sigmoid(gate) > 0.5 -> llm drop
}
"""


def make_models(tmp_path, hidden: int = 12) -> None:
    for name in ("small", "large"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"hidden_size": hidden, "vocab_size": 50}))


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_init_router_round_trip(tmp_path, kind):
    make_models(tmp_path)
    (tmp_path / "p.tr").write_text(POLICY.replace("KIND", kind))
    runner = CliRunner()
    res = runner.invoke(
        app, ["compile", str(tmp_path / "p.tr"), "-o", str(tmp_path / "p.plan"), "--no-weights-check"]
    )
    assert res.exit_code == 0, res.output  # the router file is written next
    out = tmp_path / "gate.safetensors"
    res = runner.invoke(app, ["init-router", str(tmp_path / "p.plan"), "gate", "-o", str(out), "--seed", "4",
                              "--hidden-layers", "7,5"])  # fmt: skip
    assert res.exit_code == 0, res.output
    d = 12 + 5 + 3 + 12
    tensors = load_file(str(out))
    if kind == "linear":
        assert {k: list(v.shape) for k, v in tensors.items()} == {"weight": [1, d], "bias": [1]}
    else:
        assert [list(tensors[f"layers.{i}.weight"].shape) for i in range(3)] == [[7, d], [5, 7], [1, 5]]
    from safetensors import safe_open

    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "tokenrouter.router/1" and meta["kind"] == kind
    assert meta["inputs"] == "hidden(slm), topk_logits(slm, 5), topk_logprobs(slm, 3), embedding(slm, token)"
    # the compiler accepts the file, and the runtime loads it with the hidden size from config.json
    res = runner.invoke(app, ["check", str(tmp_path / "p.tr")])
    assert res.exit_code == 0 and "warning" not in res.output, res.output
    from tokenrouter.compiler.plan import read_plan

    plan = read_plan(tmp_path / "p.plan")
    table = torch.randn(50, 12)
    kernel = RouteKernel(plan, "slm", "torch", embed=lambda t: table[t])
    assert kernel.needs_hidden and kernel.hidden_size == 12
    result = kernel(random_logits(3, 50, 0), torch.randn(3, 12), mixed_state(3), with_features=True)
    assert result.features["gate"].shape == (3,) and torch.isfinite(result.features["gate"]).all()
    # same seed, same file; another seed, other weights
    again = tmp_path / "again.safetensors"
    runner.invoke(app, ["init-router", str(tmp_path / "p.plan"), "gate", "-o", str(again), "--seed", "4",
                        "--hidden-layers", "7,5"])  # fmt: skip
    other = load_file(str(again))
    assert all(torch.equal(tensors[k], other[k]) for k in tensors)


def test_init_router_errors(tmp_path):
    (tmp_path / "p.tr").write_text(POLICY.replace("KIND", "mlp"))  # models are hub ids: no config.json
    runner = CliRunner()
    res = runner.invoke(app, ["init-router", str(tmp_path / "p.tr"), "gate", "-o", str(tmp_path / "g.st")])
    assert res.exit_code == 1 and "hidden_size is unknown" in res.output and "--hidden-size" in res.output
    res = runner.invoke(app, ["init-router", str(tmp_path / "p.tr"), "gat", "-o", str(tmp_path / "g.st")])
    assert res.exit_code == 1 and "no router 'gat'" in res.output
    res = runner.invoke(app, ["init-router", str(tmp_path / "p.tr"), "gate", "--hidden-layers", "0"])
    assert res.exit_code == 2
    res = runner.invoke(app, ["init-router", str(tmp_path / "missing.plan"), "gate"])
    assert res.exit_code == 2
    res = runner.invoke(app, ["init-router", str(tmp_path / "p.tr"), "gate", "--hidden-size", "8"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "gate.safetensors").is_file()  # the router's own path by default


INPUTS = [
    {"kind": "hidden", "model": "slm"},
    {"kind": "topk_logits", "model": "slm", "k": 4},
    {"kind": "topk_logprobs", "model": "slm", "k": 2},
    {"kind": "embedding", "model": "slm"},
]


def router_plan(tmp_path, kind: str, tensors: dict | None = None, hidden: int = 6) -> dict:
    path = str(tmp_path / f"{kind}.safetensors")
    spec = RouterSpec.from_plan("gate", {"kind": kind, "path": path, "inputs": INPUTS})
    if tensors is None:
        tensors = untrained_router_tensors(kind, spec.width(hidden), (5,), seed=2)
    write_router(path, spec, tensors)
    return {"routes": {"slm": with_router()}, "routers": {"gate": {"kind": kind, "path": path, "inputs": INPUTS}},
            "models": {"slm": {"path": "no/such/model"}}}  # fmt: skip


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_router_output_matches_float64(tmp_path, kind):
    hidden = 6
    d = hidden + 4 + 2 + hidden
    tensors = untrained_router_tensors(kind, d, (5,), seed=2)
    tensors["input_mean"] = torch.randn(d) * 0.1
    tensors["input_std"] = torch.rand(d) + 0.5
    plan = router_plan(tmp_path, kind, tensors, hidden)
    table = torch.randn(40, hidden)
    kernel = RouteKernel(plan, "slm", "torch", embed=lambda t: table[t])  # hidden size implied by the file
    assert kernel.hidden_size == hidden
    logits, h = random_logits(5, 40, 1), torch.randn(5, hidden)
    result = kernel(logits, h, mixed_state(5), with_features=True)
    x = logits.double()
    top = x.topk(4, dim=-1).values
    x_in = torch.cat([h.double(), top, top[:, :2] - torch.logsumexp(x, -1, keepdim=True),
                      table[result.token].double()], dim=-1)  # fmt: skip
    x_in = (x_in - tensors["input_mean"].double()) / tensors["input_std"].double()
    if kind == "linear":
        want = (x_in @ tensors["weight"].double().T + tensors["bias"].double())[:, 0]
    else:
        z = torch.relu(x_in @ tensors["layers.0.weight"].double().T + tensors["layers.0.bias"].double())
        want = (z @ tensors["layers.1.weight"].double().T + tensors["layers.1.bias"].double())[:, 0]
    torch.testing.assert_close(result.features["gate"].double(), want, rtol=1e-5, atol=1e-5)
    expected_rule = torch.where(torch.sigmoid(want) > 0.5, 0, -1)
    ok = (want.abs() > 1e-4) & ~((want < -0.2) & (result.features["confidence"] < 0.9))
    assert torch.equal(result.rule[ok].long(), expected_rule[ok].long())


def test_router_file_that_does_not_fit(tmp_path):
    plan = router_plan(tmp_path, "linear", {"weight": torch.zeros(1, 17), "bias": torch.zeros(1)})
    with pytest.raises(RouterFileError) as err:  # D = 17 fits no hidden size: 2H + 6 is even
        RouteKernel(plan, "slm", "torch", embed=lambda t: t)
    assert "linear.safetensors" in str(err.value) and "D = 17" in str(err.value)
    with pytest.raises(RouterFileError) as err:  # fits H = 6 but not the hidden size we say the model has
        RouteKernel(router_plan(tmp_path, "linear", None, hidden=6), "slm", "torch", embed=lambda t: t,
                    hidden_size=8)  # fmt: skip
    assert "hidden_size 8" in str(err.value)
    bad = {"layers.0.weight": torch.zeros(3, 18), "layers.0.bias": torch.zeros(3),
           "layers.1.weight": torch.zeros(2, 3), "layers.1.bias": torch.zeros(2)}  # fmt: skip
    with pytest.raises(RouterFileError, match="last layer must have 1 output"):
        RouteKernel(router_plan(tmp_path, "mlp", bad), "slm", "torch", embed=lambda t: t)
    extra = {"weight": torch.zeros(1, 18), "bias": torch.zeros(1), "input_mean": torch.zeros(18)}
    with pytest.raises(RouterFileError, match="come together"):
        RouteKernel(router_plan(tmp_path, "linear", extra), "slm", "torch", embed=lambda t: t)
    stray = {"weight": torch.zeros(1, 18), "bias": torch.zeros(1), "junk": torch.zeros(2)}
    with pytest.raises(RouterFileError, match="unexpected tensors"):
        RouteKernel(router_plan(tmp_path, "linear", stray), "slm", "torch", embed=lambda t: t)


def test_missing_or_unreadable_router_file(tmp_path):
    plan = router_plan(tmp_path, "linear")
    path = plan["routers"]["gate"]["path"]
    (tmp_path / "linear.safetensors").write_bytes(b"\x00not a safetensors file")
    with pytest.raises(RouterFileError, match="not a readable safetensors file") as err:
        RouteKernel(plan, "slm", "torch", embed=lambda t: t)
    assert path in str(err.value)
    (tmp_path / "linear.safetensors").unlink()
    with pytest.raises(RouterFileError, match="weights not found") as err:
        RouteKernel(plan, "slm", "torch", embed=lambda t: t)
    assert path in str(err.value) and "train-router" in str(err.value) and "init-router" not in str(err.value)


def test_kernel_input_errors(tmp_path):
    plan = router_plan(tmp_path, "linear")
    with pytest.raises(RouteKernelError, match="embed"):
        RouteKernel(plan, "slm", "torch")
    with pytest.raises(RouteKernelError, match="no route block for model 'llm'"):
        RouteKernel(plan, "llm", "torch")
    kernel = RouteKernel(plan, "slm", "torch", embed=lambda t: torch.zeros(t.shape[0], 6))
    with pytest.raises(RouteKernelError, match="hidden"):
        kernel(random_logits(2, 40, 0), None, mixed_state(2))
    with pytest.raises(RouteKernelError, match=r"hidden must be \[2, 6\]"):
        kernel(random_logits(2, 40, 0), torch.zeros(2, 7), mixed_state(2))
    with pytest.raises(RouteKernelError, match="state.seed"):
        kernel(random_logits(3, 40, 0), torch.zeros(3, 6), mixed_state(2))
    with pytest.raises(RouteKernelError, match="backend"):
        RouteKernel(plan, "slm", "cuda-magic")


def test_loading_never_unpickles(tmp_path):
    """A .safetensors path that holds a torch pickle is refused, not loaded."""
    plan = router_plan(tmp_path, "linear")
    torch.save({"weight": torch.zeros(1, 18), "bias": torch.zeros(1)}, plan["routers"]["gate"]["path"])
    with pytest.raises(RouterFileError):
        RouteKernel(plan, "slm", "torch", embed=lambda t: t)
    save_file({"weight": torch.zeros(1, 18), "bias": torch.zeros(1)}, plan["routers"]["gate"]["path"])
    RouteKernel(plan, "slm", "torch", embed=lambda t: t)  # the same tensors as safetensors load


def test_a_router_file_swapped_since_compile_is_refused_naming_both_digests(tmp_path):
    import hashlib

    from tokenrouter.runtime.route.routers import check_router_digests

    f = tmp_path / "r.safetensors"
    f.write_bytes(b"compiled with this")
    want = hashlib.sha256(f.read_bytes()).hexdigest()
    plan = {"routers": {"r": {"model": "a", "path": str(f), "sha256": want}}}
    check_router_digests(plan, "a")  # unchanged: fine
    f.write_bytes(b"swapped")
    check_router_digests(plan, "b")  # not a router of model b
    with pytest.raises(RouterFileError) as err:
        check_router_digests(plan, "a")
    assert want in str(err.value) and hashlib.sha256(b"swapped").hexdigest() in str(err.value)
    plan["routers"]["r"]["sha256"] = None  # compiled without the file: nothing to compare
    check_router_digests(plan, "a")
