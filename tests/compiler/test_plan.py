"""Plans round-trip through write_plan/read_plan; broken or hand-edited plans raise PlanError."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tokenrouter.compiler.driver import compile_file
from tokenrouter.compiler.passes.check_feasibility import feasibility_error
from tokenrouter.compiler.plan import PlanError, read_plan, write_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def citer_plan() -> dict[str, Any]:
    plan = compile_file(REPO / "examples" / "citer.tr", weights_check=False).plan  # its router is not shipped
    assert plan is not None
    return plan


def test_round_trip_beside_the_source(tmp_path: Path, citer_plan: dict) -> None:
    out = tmp_path / "citer.plan"
    write_plan(citer_plan, out)
    stored = json.loads(out.read_text())
    assert not Path(stored["models"]["slm"]["path"]).is_absolute()  # relative to the plan's directory
    back = read_plan(out)
    assert back == citer_plan  # absolute paths again, everything else equal


def test_relative_paths_move_with_the_plan(tmp_path: Path) -> None:
    plan = compile_file(REPO / "examples" / "bernoulli.tr").plan
    assert plan is not None
    out = tmp_path / "sub" / "b.plan"
    out.parent.mkdir()
    write_plan(plan, out)
    assert read_plan(out)["models"]["slm"]["path"] == str((REPO / "examples/models/py-small").resolve())


def test_hub_ids_stay_as_written(tmp_path: Path) -> None:
    plan = compile_file(REPO / "tokenrouter" / "stdlib" / "citer.tr", weights_check=False).plan
    assert plan is not None
    write_plan(plan, tmp_path / "c.plan")
    back = read_plan(tmp_path / "c.plan")
    assert back["models"]["slm"]["path"] == "Qwen/Qwen3-0.6B"
    assert Path(back["routers"]["trust"]["path"]).is_absolute()


def _edit(plan: dict, path: str, value: Any) -> dict:
    out = copy.deepcopy(plan)
    *parents, last = path.split("/")
    node = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


DELETE = object()
BROKEN = [
    ("format", "tokenrouter.plan/2", "plan version 'tokenrouter.plan/2' is not supported"),
    ("format", "something", "not a tokenrouter plan"),
    ("entry", "nobody", "field entry"),
    ("models/slm/batch", 0, "field models.slm.batch"),
    ("models/slm/gpus", [], "field models.slm.gpus"),
    ("models/slm/dtype", "int4", "field models.slm.dtype"),
    ("models/slm/extra", 1, "field models.slm.extra: unknown field"),
    ("models/slm/path", DELETE, "field models.slm.path: missing"),
    ("serve/concurrency", 0, "field serve.concurrency"),
    ("routes/slm/nodes/1/op", "exec", "field routes.slm.nodes[1].op: 'exec' is not an IR operation"),
    ("routes/slm/nodes/1/args", [3], "arguments must be indices of earlier nodes"),
    ("routes/slm/nodes/3/type", "float", "field routes.slm.nodes[3].type"),
    ("routes/slm/rules/0/cond", 2, "field routes.slm.rules[0].cond"),
    ("routes/slm/rules/0/target", "slm", "field routes.slm.rules[0].target"),
    ("routes/slm/rules/0/for", 0, "field routes.slm.rules[0].for"),
    ("routes/slm/features", ["token"], "field routes.slm.features"),
    ("routes/llm", DELETE, "field routes: expected one entry per model"),
    ("routers/gate/inputs/0/kind", "logits", "field routers.gate.inputs[0].kind"),
    ("source/text", "policy x\n", "field source.sha256: does not match"),
    ("checks/progress/ok", False, "field checks.progress.ok"),
    ("checks/feasibility/slack", 99, "field checks.feasibility.slack"),
    ("params/threshold/value", "high", "field params.threshold.value"),
    # a list or an object where a name belongs (they cannot be looked up in a dict)
    ("entry", [], "field entry: [] is not one of the models"),
    ("entry", {}, "field entry: {} is not one of the models"),
    ("routes/slm/nodes/1/op", [], "field routes.slm.nodes[1].op: [] is not an IR operation"),
    ("routes/slm/nodes/1/op", {}, "field routes.slm.nodes[1].op: {} is not an IR operation"),
    ("routes/slm/nodes/0/name", [], "field routes.slm.nodes[0].name"),
    ("routes/slm/nodes/0/type", {}, "field routes.slm.nodes[0].type"),
    ("routes/slm/rules/0/target", [], "field routes.slm.rules[0].target"),
    ("routes/slm/rules/0/target", {}, "field routes.slm.rules[0].target"),
    ("routers/gate/model", [], "field routers.gate.model"),
    ("params/threshold/type", {}, "field params.threshold.type"),
    ("serve/concurrency", 10**20, "field serve.concurrency: expected an int in [1, 65536]"),
    (
        "routes/slm/rules/0/for",
        10**23,
        "field routes.slm.rules[0].for: expected an int in [1, 1000000] or null",
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "message"), BROKEN, ids=[b[0] + "=" + repr(b[1])[:20] for b in BROKEN]
)
def test_hand_edited_plans_are_rejected(
    tmp_path: Path, citer_plan: dict, path: str, value: Any, message: str
) -> None:
    write_plan(citer_plan, tmp_path / "ok.plan")
    data = json.loads((tmp_path / "ok.plan").read_text())
    bad = tmp_path / "bad.plan"
    bad.write_text(json.dumps(_edit(data, path, value)))
    with pytest.raises(PlanError) as err:
        read_plan(bad)
    assert str(bad) in str(err.value) and message in str(err.value)


def test_infeasible_hand_edit_gets_the_feasibility_message(tmp_path: Path, citer_plan: dict) -> None:
    write_plan(citer_plan, tmp_path / "ok.plan")
    data = json.loads((tmp_path / "ok.plan").read_text())
    data["models"]["slm"]["batch"] = 5
    data["models"]["llm"]["batch"] = 5
    (tmp_path / "bad.plan").write_text(json.dumps(data))
    with pytest.raises(PlanError, match="delayed batching can deadlock"):
        read_plan(tmp_path / "bad.plan")


def test_unreadable_plans(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="no such plan file"):
        read_plan(tmp_path / "missing.plan")
    (tmp_path / "dir.plan").mkdir()
    with pytest.raises(PlanError, match="dir.plan: is a directory, not a plan file"):
        read_plan(tmp_path / "dir.plan")
    (tmp_path / "bad.plan").write_text("{not json")
    with pytest.raises(PlanError, match=r"bad.plan:1:2: not valid JSON"):
        read_plan(tmp_path / "bad.plan")
    (tmp_path / "list.plan").write_text("[]")
    with pytest.raises(PlanError, match="expected an object"):
        read_plan(tmp_path / "list.plan")


def test_feasibility_error_message() -> None:
    assert feasibility_error({"a": 1, "b": 7}, 7) is None
    msg = feasibility_error({"b": 5, "a": 4}, 7)
    assert msg is not None
    assert "(a batch 4, b batch 5)" in msg and "Σ(B_i − 1) = 7" in msg and "concurrency N = 7" in msg
