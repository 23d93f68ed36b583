"""`tokenrouter generate PLAN|POLICY`: the plan form of generate (in-process executor)."""

from __future__ import annotations

import json

from subserver_helpers import SMALL, compile_policy
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.compiler.plan import write_plan
from tokenrouter.runtime.messages import SamplingSpec
from tokenrouter.runtime.offline import load_offline

runner = CliRunner()


def test_generate_plan_json_and_trace(tmp_path):
    plan = compile_policy(tmp_path, "drop")
    path = tmp_path / "drop.plan"
    write_plan(plan, path)
    r = runner.invoke(app, ["generate", str(path), "--prompt-ids", "5,6,7", "--max-tokens", "12", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    expected = load_offline(plan, "cpu").generate([[5, 6, 7]], SamplingSpec(seed=0, max_tokens=12))[0]
    assert out["token_ids"] == expected.token_ids and out["models"] == expected.models
    assert out["tokens_per_model"] == {"a": expected.models.count("a"), "b": expected.models.count("b")}
    assert isinstance(out["text"], str) and len(out["pieces"]) == len(out["token_ids"])
    r = runner.invoke(app, ["generate", str(path), "--prompt", "def f(x):", "--max-tokens", "6", "--trace"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    trace = [ln.split() for ln in lines if ln.startswith("   ")]
    assert len(trace) == 6 and all(t[1] in ("a", "b") for t in trace)
    assert lines[-1].startswith("tokens: a ")


def test_generate_policy_compiled_on_the_fly_with_defines(tmp_path):
    src = tmp_path / "p.tr"
    src.write_text(f'policy p\nparam q: float = 0.0\nmodel s = "{SMALL}"\nmodel t = "{SMALL}"\nentry s\n'
                   "route s { when uniform() < q -> t }\nroute t { -> s }\n")  # fmt: skip
    never = runner.invoke(app, ["generate", str(src), "--prompt-ids", "9,9", "--max-tokens", "8", "--json"])
    always = runner.invoke(app, ["generate", str(src), "--prompt-ids", "9,9", "--max-tokens", "8", "--json", "-D", "q=1.0"])  # fmt: skip
    assert never.exit_code == 0 and always.exit_code == 0, never.output + always.output
    assert set(json.loads(never.output)["models"]) == {"s"}
    assert json.loads(always.output)["models"] == ["s", "t"] * 4


def test_generate_plan_user_errors(tmp_path):
    bad = tmp_path / "bad.tr"
    bad.write_text('policy x\nmodel a = "nope"\nentry b\n')
    r = runner.invoke(app, ["generate", str(bad), "--prompt-ids", "1"])
    assert r.exit_code == 1 and "unknown model 'b'" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["generate", str(tmp_path / "none.plan"), "--prompt-ids", "1"])
    assert r.exit_code == 2 and "no such" in r.output
    plan_path = tmp_path / "k.plan"
    write_plan(compile_policy(tmp_path, "keep"), plan_path)
    for args, code, text in [
        (["-D", "q=1"], 2, "-D applies to a .tr"),
        (["--max-tokens", "0"], 2, "max_tokens"),
        (["--dtype", "float16"], 2, "from the plan"),
    ]:
        r = runner.invoke(app, ["generate", str(plan_path), "--prompt-ids", "1,2", *args])
        assert r.exit_code == code and text in r.output, r.output
    r = runner.invoke(app, ["generate", str(plan_path), "--prompt-ids", "1,99999"])
    assert r.exit_code == 1 and "out of range" in r.output
    notplan = tmp_path / "x.json"
    notplan.write_text("{}")
    r = runner.invoke(app, ["generate", str(notplan), "--prompt-ids", "1"])
    assert r.exit_code == 2 and "not a model folder" in r.output
