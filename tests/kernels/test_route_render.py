"""Rendering: the IR checker keeps plans inside the closed vocabulary, and the templates emit one line per
node from a macro per operation."""

from __future__ import annotations

import copy

import pytest
from route_cases import CASES, counters

from tokenrouter.compiler.kernels import BACKENDS, RouteIRError, check_route_ir, render_route_kernel


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda ir: ir["nodes"].append({"op": "system", "args": [], "type": "int"}), "unknown op 'system'"),
        (lambda ir: ir["nodes"][0].update(name="__import__"), "unknown feature"),
        (lambda ir: ir["nodes"][1].update(args=[5]), "not the index of an earlier node"),
        (lambda ir: ir["nodes"][1].update(args=[0, 0]), "takes 1 args"),
        (
            lambda ir: ir["nodes"].append({"op": "const", "value": "os.system('x')", "type": "int"}),
            "number or bool",
        ),
        (
            lambda ir: ir["nodes"].append({"op": "const", "value": float("inf"), "type": "float"}),
            "float constant",
        ),
        (
            lambda ir: ir["nodes"].append({"op": "router", "name": "x); import os #", "type": "float"}),
            "not listed",
        ),
        (lambda ir: ir.update(routers=["a b"]), "list of names"),
        (lambda ir: ir["rules"].insert(0, {"cond": None}), "unconditional rule must be the last"),
        (lambda ir: ir["rules"].append({"cond": 0}), "not bool"),
        (lambda ir: ir.update(uses_uniform=True), "uses_uniform"),
        (lambda ir: ir["nodes"][0].update(type="float"), "has type int"),
        (lambda ir: ir.update(features=[]), "does not list them"),
    ],
)
def test_checker_rejects(mutate, message):
    ir = counters()
    ir = copy.deepcopy(ir)
    ir["nodes"][1] = {"op": "neg", "args": [0], "type": "int"}  # node 1 := -run_length (node 0)
    mutate(ir)
    with pytest.raises(RouteIRError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_route_ir(ir)


def test_type_rules_are_checked():
    ir = counters()
    ir["nodes"].append({"op": "add", "args": [0, 1], "type": "float"})  # int + int is int
    with pytest.raises(RouteIRError, match="result type is int"):
        check_route_ir(ir)


@pytest.mark.parametrize("backend", BACKENDS)
def test_source_comments_cannot_break_out(backend):
    ir = CASES["citer_like"]()
    ir["rules"][0]["source"] = "x\nimport os\r\nos.system('boom')\u2028y"
    src = render_route_kernel(ir, backend)
    assert "\nimport os" not in src and "\nos.system" not in src
    compile(src, "<rendered>", "exec")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_assignment_per_node_and_only_needed_statistics(backend, case):
    ir = CASES[case]()
    src = render_route_kernel(ir, backend)
    compile(src, "<rendered>", "exec")
    for i in range(len(ir["nodes"])):
        assert f"v{i} = " in src
    needs_entropy = {"entropy", "norm_entropy"} & set(ir["features"])
    entropy_acc = "e * (x - m" if backend == "torch" else "t += tl.sum(e * tl.maximum(y,"
    top2 = "topk(2" if backend == "torch" else "n_top = tl.sum(tl.sum(is_top"
    assert (entropy_acc in src) == bool(needs_entropy)  # the entropy accumulator only where read
    assert (top2 in src) == ("margin" in ir["features"])


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown route-kernel backend"):
        render_route_kernel(CASES["citer_like"](), "cuda")


def test_inspect_kernels_prints_both_renderers(tmp_path):
    from typer.testing import CliRunner

    from tokenrouter.cli import app

    policy = tmp_path / "p.tr"
    policy.write_text(
        'policy p "inspect test"\nmodel a = "x" { gpu: 0 }\nmodel b = "y" { gpu: 0 }\nentry a\n'
        "route a {\n  when entropy > 2.5 or uniform() < 0.1 -> b\n}\n"
    )
    runner = CliRunner()
    compiled = runner.invoke(
        app, ["compile", str(policy), "-o", str(tmp_path / "p.plan"), "--no-weights-check"]
    )
    assert compiled.exit_code == 0, compiled.output
    res = runner.invoke(app, ["inspect", str(tmp_path / "p.plan"), "--kernels"])
    assert res.exit_code == 0, res.output
    for model in ("a", "b"):
        for backend in BACKENDS:
            assert f"# ===== model {model}: {backend} route kernel =====" in res.output
    assert "def route_kernel(" in res.output and "def route_stats(" in res.output
    assert "# rule 0: when entropy > 2.5 or uniform() < 0.1 -> b" in res.output
    res = runner.invoke(app, ["inspect", str(tmp_path / "p.plan"), "--kernels", "--sampler", "strided"])
    assert res.exit_code == 0 and "def _draw_strided(" in res.output and "SAMPLER = 'strided'" in res.output
    res = runner.invoke(app, ["inspect", str(tmp_path / "p.plan"), "--kernels", "--sampler", "gumbel"])
    assert res.exit_code == 1 and "unknown sampler" in res.output
