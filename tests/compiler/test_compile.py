"""Every stdlib and example policy compiles; the IR is what docs/ir.md says for each construct."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tokenrouter.compiler.driver import compile_file, compile_source, load_plan
from tokenrouter.compiler.plan import PlanError, validate_plan

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted([*REPO.glob("tokenrouter/stdlib/*.tr"), *REPO.glob("examples/*.tr")])
FIXTURES = REPO / "tests" / "fixtures"
UNSHIPPED_WEIGHTS = {"citer.tr"}  # examples whose router file is not in the repository


def compile_ok(
    src: str, defines: dict[str, str] | None = None, file: str | None = None, weights_check: bool = True
) -> dict:
    result = compile_source(src, file or str(FIXTURES / "diagnostics" / "inline.tr"), defines, weights_check)
    assert result.plan is not None, "\n".join(d.render() for d in result.diagnostics)
    validate_plan(result.plan)
    return result.plan


def two_models(route_a: str, route_b: str = "-> a", head: str = "") -> str:
    return (
        f'policy t\n{head}\nmodel a = "../models/h4"\nmodel b = "../models/h4"\nentry a\n'
        f"route a {{\n{route_a}\n}}\nroute b {{\n{route_b}\n}}\n"
    )


def test_stdlib_has_the_six_policies() -> None:
    names = {p.stem for p in REPO.glob("tokenrouter/stdlib/*.tr")}
    assert names >= {"r2r", "citer", "co_llm", "r_stitch", "multi_expert", "bernoulli"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_policies_compile(path: Path) -> None:
    # the stdlib names hub models and routers a user trains; an example ships its weights (but citer's router)
    weights_check = path.parent.name == "examples" and path.name not in UNSHIPPED_WEIGHTS
    result = compile_file(path, weights_check=weights_check)
    assert result.plan is not None, "\n".join(d.render() for d in result.diagnostics)
    assert all(d.severity == "warning" for d in result.diagnostics)
    validate_plan(result.plan)
    assert "#" in path.read_text()  # every shipped policy says what it is
    if path.parent.name == "stdlib":
        assert (
            "param threshold" in path.read_text()
            or "param p:" in path.read_text()
            or "param eta" in path.read_text()
            or "param w_a" in path.read_text()
        )


def test_citer_lowers_to_the_ir_md_example() -> None:
    plan = compile_file(REPO / "examples" / "citer.tr", weights_check=False).plan
    assert plan is not None
    slm = plan["routes"]["slm"]
    assert slm["nodes"] == [
        {"op": "router", "name": "gate", "type": "float"},
        {"op": "sigmoid", "args": [0], "type": "float"},
        {"op": "const", "value": 0.5, "type": "float"},
        {"op": "gt", "args": [1, 2], "type": "bool"},
    ]
    assert slm["rules"] == [
        {"cond": 3, "target": "llm", "drop": True, "for": None,
         "source": "when sigmoid(gate) > threshold -> llm drop", "line": 21}
    ]  # fmt: skip
    assert slm["routers"] == ["gate"] and slm["features"] == [] and slm["uses_uniform"] is False
    assert plan["routes"]["llm"]["rules"][0]["cond"] is None
    assert plan["routers"]["gate"]["inputs"] == [{"kind": "hidden", "model": "slm"}]
    assert plan["models"]["slm"]["path"] == str((REPO / "examples" / "models" / "py-small").resolve())


def test_defines_override_params_by_type() -> None:
    plan = compile_file(REPO / "examples" / "bernoulli.tr", {"p": "0.25", "slm_batch": "3"}).plan
    assert plan is not None
    assert plan["params"]["p"] == {"type": "float", "value": 0.25}
    assert plan["models"]["slm"]["batch"] == 3
    assert plan["routes"]["slm"]["nodes"][1] == {"op": "const", "value": 0.25, "type": "float"}
    assert plan["routes"]["slm"]["uses_uniform"] is True


def test_imported_params_and_fns_are_qualified_and_overridable() -> None:
    plan = compile_file(REPO / "examples" / "r_stitch.tr", {"rs.threshold": "0.4"}).plan
    assert plan is not None
    assert plan["params"]["rs.threshold"]["value"] == 0.4
    nodes = plan["routes"]["llm"]["nodes"]
    assert [n["op"] for n in nodes] == ["feature", "const", "gt", "not"]
    assert nodes[1]["value"] == 0.4


def test_fn_inlining_in_lowering_and_cse() -> None:
    plan = compile_ok(
        two_models("when f(margin) or f(margin) and token in [1, 2] -> b", head="fn f(x: float) = x * 2 > 1")
    )
    nodes = plan["routes"]["a"]["nodes"]
    # f(margin) is inlined once and shared; the constants 1 and 2 are shared with `token in [1, 2]`
    assert [(n["op"], n.get("args")) for n in nodes] == [
        ("feature", None), ("const", None), ("mul", [0, 1]), ("const", None), ("gt", [2, 3]), ("feature", None),
        ("eq", [5, 3]), ("eq", [5, 1]), ("or", [6, 7]), ("and", [4, 8]), ("or", [4, 9]),
    ]  # fmt: skip
    assert plan["routes"]["a"]["rules"][0]["cond"] == 10
    assert plan["routes"]["a"]["features"] == ["margin", "token"]


def test_types_promote_and_min_max_chain() -> None:
    plan = compile_ok(two_models("when max(run_length, generated, 2.5) / 2 > abs(-position) -> b"))
    nodes = plan["routes"]["a"]["nodes"]
    by_op = {n["op"]: n for n in nodes}
    assert [n["op"] for n in nodes].count("max") == 2
    assert by_op["div"]["type"] == "float" and by_op["abs"]["type"] == "int" and by_op["neg"]["type"] == "int"


def test_uniform_is_one_node_per_step() -> None:
    plan = compile_ok(two_models("when uniform() < 0.5 -> b\nwhen uniform() < 0.8 -> b drop"))
    assert [n["op"] for n in plan["routes"]["a"]["nodes"]].count("uniform") == 1


def test_for_k_from_an_int_param_and_defaults() -> None:
    plan = compile_ok(two_models("when margin < 0.1 -> b drop for k", "", head="param k: int = 3"))
    assert plan["routes"]["a"]["rules"][0]["for"] == 3
    assert plan["routes"]["b"]["rules"] == []
    assert plan["models"]["a"] == {"path": str((FIXTURES / "models" / "h4").resolve()), "gpus": [0],
        "batch": "auto", "mem": None, "dtype": "bfloat16", "max_len": None, "engine": "embedded", "load": "auto"}  # fmt: skip
    assert plan["serve"] == {"concurrency": 8, "max_delay_ms": 5.0}


def test_feasibility_check_in_plan() -> None:
    src = two_models("when margin < 0.1 -> b").replace('h4"\nmodel b', 'h4" { batch: 3 }\nmodel b')
    plan = compile_ok(src.replace("entry a", "entry a\nserve { concurrency: 4 }"))
    assert plan["checks"]["feasibility"] == {"ok": True, "concurrency": 4, "fixed": {"a": 3}, "auto": ["b"],
        "slack": 1, "message": "Σ(B_i − 1) = 2 < N = 4 (auto thresholds b counted as 1)"}  # fmt: skip


def test_router_shapes_fit(tmp_path: Path) -> None:
    plan = compile_ok(
        two_models(
            "when r > 0 -> b",
            head='router r = mlp("../routers/mlp_d6.safetensors", hidden(a), topk_logits(a, 2))',
        )
    )
    r = plan["routers"]["r"]
    assert r["sha256"] and len(r["sha256"]) == 64 and r["model"] == "a"
    assert r["inputs"] == [{"kind": "hidden", "model": "a"}, {"kind": "topk_logits", "model": "a", "k": 2}]


def test_router_without_config_at_hand_only_warns() -> None:
    src = two_models(
        "when r > 0 -> b", head='router r = linear("../routers/linear_d5.safetensors", hidden(a))'
    )
    src = src.replace('model a = "../models/h4"', 'model a = "org/some-model"')
    result = compile_source(src, str(FIXTURES / "diagnostics" / "inline.tr"))
    assert result.plan is not None
    assert any(
        "config.json of a not at hand" in d.message and d.severity == "warning" for d in result.diagnostics
    )


def test_progress_allows_drop_cycles_with_for_or_conditions() -> None:
    compile_ok(two_models("-> b drop for 1", "-> a drop"))
    compile_ok(two_models("when margin < 0.5 -> b drop", "-> a drop"))


def test_missing_file_is_a_diagnostic() -> None:
    result = compile_file(FIXTURES / "nope.tr")
    assert result.plan is None and "no such file" in result.diagnostics[0].message


def test_imported_router_is_named_alias__name_and_reads_the_importers_model() -> None:
    src = (
        'policy t\nimport stdlib.citer as c\nmodel slm = "../models/h4"\nmodel llm = "../models/h4"\nentry slm\n'
        "route slm {\n  when c.trust < c.threshold -> llm drop\n}\nroute llm {\n  -> slm\n}\n"
    )
    plan = compile_ok(src, weights_check=False)  # the stdlib's router file is one a user trains
    router = plan["routers"]["c__trust"]
    assert router["model"] == "slm" and router["path"] == str(
        REPO / "tokenrouter" / "stdlib" / "citer_router.safetensors"
    )
    assert plan["routes"]["slm"]["routers"] == ["c__trust"]
    assert plan["params"]["c.threshold"] == {"type": "float", "value": 0.5}


def test_imported_router_over_missing_models_fails_only_where_used() -> None:
    head = "import stdlib.citer as c"
    compile_ok(two_models("when c.threshold > margin -> b", head=head))  # unused: fine
    result = compile_source(
        two_models("when c.trust > 0 -> b", head=head), str(FIXTURES / "diagnostics" / "x.tr")
    )
    assert result.plan is None
    assert [d.message for d in result.errors] == [
        "router 'c.trust' reads model slm, which this policy does not declare"
    ]


def _fn_chain(n: int, body: str, first: str = "f0(margin)") -> str:
    """fn f0 … f{n-1}, each `body` with NEXT the next fn, f{n} = x; a rule uses `first`."""
    fns = "\n".join(f"fn f{i}(x: float) = " + body.replace("NEXT", f"f{i + 1}") for i in range(n))
    return two_models(f"when {first} > 1 -> b", head=f"{fns}\nfn f{n}(x: float) = x")


def test_a_long_chain_of_fn_calls_is_one_error_not_a_recursion_error() -> None:
    compile_ok(_fn_chain(150, "NEXT(x)"))
    result = compile_source(_fn_chain(500, "NEXT(x)"), str(FIXTURES / "diagnostics" / "x.tr"))
    assert result.plan is None
    assert [d.message for d in result.errors] == [
        "fn calls nested too deep: inlined here, f301() makes the expression 201 levels deep; at most 200 are allowed"
    ]


def test_fns_that_call_the_next_twice_are_bounded_not_expanded_for_ever() -> None:
    compile_ok(_fn_chain(8, "NEXT(x) + NEXT(x)"))  # 2^8 inlined copies, shared again in the IR
    start = time.perf_counter()
    result = compile_source(_fn_chain(40, "NEXT(x) + NEXT(x)"), str(FIXTURES / "diagnostics" / "x.tr"))
    assert time.perf_counter() - start < 5
    assert result.plan is None and len(result.errors) == 1
    assert "operations once its fn calls are inlined" in result.errors[0].message


def test_nested_fn_arguments_are_lowered_once_each() -> None:
    deep = "g(" * 60 + "margin" + ")" * 60  # g(x) uses x twice: 2^60 paths, 60 distinct values
    plan = compile_ok(two_models(f"when {deep} > 1 -> b", head="fn g(x: float) = x + x"))
    assert len(plan["routes"]["a"]["nodes"]) == 63


def test_long_chains_of_params_bind_and_a_long_cycle_is_an_error() -> None:
    params = "\n".join(f"param p{i}: float = p{i + 1} + 0" for i in range(1500))
    plan = compile_ok(two_models("when margin > p0 -> b", head=f"{params}\nparam p1500: float = 0.5"))
    assert plan["params"]["p0"]["value"] == 0.5
    result = compile_source(
        two_models("when margin > p0 -> b", head=f"{params}\nparam p1500: float = p0"),
        str(FIXTURES / "diagnostics" / "x.tr"),
    )
    assert result.plan is None and len(result.errors) == 1
    assert "is defined through more than 64 params" in result.errors[0].message


def test_concurrency_and_for_k_have_upper_bounds() -> None:
    src = two_models(
        "when margin < 0.1 -> b for 999999999999999999",
        head="serve { concurrency: 100000000000000000 }",
    )
    result = compile_source(src, str(FIXTURES / "diagnostics" / "x.tr"))
    assert [d.message for d in result.errors] == [
        "concurrency is at most 65536 requests in flight, got 100000000000000000",
        "`for K` needs K ≤ 1000000 (longer than any context), got 999999999999999999",
    ]
    plan = compile_ok(two_models("when margin < 0.1 -> b for 1000000", head="serve { concurrency: 65536 }"))
    assert plan["serve"]["concurrency"] == 65536 and plan["routes"]["a"]["rules"][0]["for"] == 1000000


@pytest.mark.parametrize("weights_check", [True, False])
def test_model_paths_that_are_no_model_folders(tmp_path: Path, weights_check: bool) -> None:
    (tmp_path / "weights.bin").write_text("")
    (tmp_path / "empty").mkdir()
    src = (
        'policy t\nmodel a = "weights.bin"\nmodel b = "empty"\nmodel c = ""\n'
        'router r = linear("empty", hidden(a))\nentry a\nroute a { when r > 0 -> b }\nroute b { -> a }\n'
    )
    result = compile_source(src, str(tmp_path / "t.tr"), weights_check=weights_check)
    messages = [(d.severity, d.message) for d in result.diagnostics]
    assert ("error", "a model path is a non-empty str, got an empty str") in messages
    shown_dir = str(tmp_path)  # outside the working directory: shown absolute
    severity = "error" if weights_check else "warning"
    assert (
        severity,
        f"model 'a': path {shown_dir}/weights.bin is a file; a model is a folder in Hugging Face format (config.json, weights)",
    ) in messages
    assert (
        severity,
        f"model 'b': path {shown_dir}/empty has no config.json; a model is a folder in Hugging Face format",
    ) in messages
    assert any(
        s == severity and f"router 'r': {shown_dir}/empty is a directory, not a weights file" in m
        for s, m in messages
    )


def test_importing_a_directory_says_so(tmp_path: Path) -> None:
    (tmp_path / "lib.tr").mkdir()
    result = compile_source(
        'policy t\nimport "lib.tr" as l\nmodel a = "x"\nentry a\n', str(tmp_path / "t.tr")
    )
    assert any(
        "cannot import" in d.message and "lib.tr: is a directory, not a file" in d.message
        for d in result.errors
    )
    assert "is a directory, not a file" in compile_file(tmp_path / "lib.tr").diagnostics[0].message


def test_load_plan_puts_the_summary_first_and_each_diagnostic_once(tmp_path: Path) -> None:
    (tmp_path / "empty.tr").write_text("")
    with pytest.raises(PlanError) as err:
        load_plan(tmp_path / "empty.tr")
    text = str(err.value)
    first, *rest = text.splitlines()
    assert first == f"{tmp_path / 'empty.tr'}: not compiled (3 errors):"
    assert rest[0].startswith(f"{tmp_path / 'empty.tr'}:1:1: error: missing `policy NAME`")
    assert text.count(": error: ") == 3  # a caller's "error: " prefix lands on the summary line
    (tmp_path / "dir.tr").mkdir()
    with pytest.raises(PlanError, match="dir.tr: is a directory, not a file"):
        load_plan(tmp_path / "dir.tr")


def _mixed(slm: Path | str, llm: Path | str) -> str:
    return (
        f'policy t\nmodel slm = "{slm}"\nmodel llm = "{llm}"\nentry slm\n'
        "route slm {\n  when margin < 0.1 -> llm for 2\n}\n"
    )


def test_models_of_another_vocabulary_size_are_an_error_at_the_model() -> None:
    models = REPO / "examples" / "models"
    result = compile_source(_mixed(models / "tiny-small", models / "py-large"), str(FIXTURES / "t.tr"))
    assert result.plan is None
    [err] = result.errors
    assert (err.line, err.col) == (3, 13)  # the path of llm: the entry is the reference
    assert "models 'slm' (" in err.message and "tiny-small) and 'llm' (" in err.message
    assert "vocab_size 512 and 4096" in err.message


def test_models_of_another_tokenizer_are_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.chdir(REPO)
    models = REPO / "examples" / "models"
    other = tmp_path / "other-large"
    shutil.copytree(models / "tiny-large", other)
    tok = json.loads((other / "tokenizer.json").read_text())
    tok["padding"] = {"strategy": "BatchLongest"}  # a setting: the same tokenizer
    (other / "tokenizer.json").write_text(json.dumps(tok))
    assert compile_source(_mixed(models / "tiny-small", other), str(FIXTURES / "t.tr")).ok
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids swapped
    (other / "tokenizer.json").write_text(json.dumps(tok))
    result = compile_source(_mixed(models / "tiny-small", other), str(FIXTURES / "t.tr"))
    assert [e.message for e in result.errors] == [
        f"models 'slm' (examples/models/tiny-small) and 'llm' ({other}) do not share a tokenizer: their "
        "tokenizer.json differ in vocabulary, merges or added tokens; a token id would mean another text to "
        "the other model"
    ]
