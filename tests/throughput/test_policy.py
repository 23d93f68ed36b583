import pytest

from tokenrouter.compiler.driver import compile_source
from tokenrouter.throughput.plan_inputs import (
    ThroughputInputError,
    ThroughputUsageError,
    parse_p,
    parse_step_ms,
    system_from_plan,
)
from tokenrouter.throughput.policy import policy_routing


def plan_of(text: str) -> dict:
    result = compile_source(text, "/tmp/t.tr", weights_check=False)  # the throughput model reads no weights
    assert result.plan is not None, [str(d) for d in result.diagnostics]
    return result.plan


HEAD = 'policy t\nmodel a = "x" { batch: auto }\nmodel b = "y" { batch: auto }\nmodel c = "z" { batch: 1 }\nentry a\n'


def test_stdlib_bernoulli_probabilities():
    from pathlib import Path

    import tokenrouter.stdlib

    path = Path(tokenrouter.stdlib.__file__).parent / "bernoulli.tr"
    plan = compile_source(path.read_text(), str(path), {"p": "0.25", "q": "0.6"}).plan
    routing = policy_routing(plan)
    assert routing.unknown == {}
    assert routing.rows["slm"] == pytest.approx({"slm": 0.75, "llm": 0.25})
    assert routing.rows["llm"] == pytest.approx({"llm": 0.4, "slm": 0.6})
    assert routing.keep["slm"]["llm"] == 1.0


def test_first_match_on_one_draw_and_unconditional():
    plan = plan_of(
        HEAD + "route a {\n when uniform() < 0.5 -> b\n when uniform() < 0.8 -> c drop\n}\n"
        "route b {\n when 0.3 > uniform() or uniform() >= 0.9 -> a\n -> c\n}\nroute c { -> a }\n"
    )
    r = policy_routing(plan)
    assert r.rows["a"] == pytest.approx({"b": 0.5, "c": 0.3, "a": 0.2})
    assert r.keep["a"]["c"] == 0.0 and r.keep["a"]["b"] == 1.0
    assert r.rows["b"] == pytest.approx({"a": 0.4, "c": 0.6})
    assert r.rows["c"] == pytest.approx({"a": 1.0})


def test_affine_uniform_and_not():
    plan = plan_of(
        HEAD
        + "route a {\n when not (uniform() * 2 - 0.5 < 0.5) -> b\n}\nroute b { -> c }\nroute c { -> a }\n"
    )
    assert policy_routing(plan).rows["a"] == pytest.approx({"b": 0.5, "a": 0.5})
    assert policy_routing(plan).rows["b"] == pytest.approx({"c": 1.0})


def test_feature_dependent_rule_is_unknown_and_for_k_implies_the_return():
    plan = plan_of(HEAD + "route a {\n when confidence < 0.4 -> b drop for 4\n -> c\n}\nroute c { -> a }\n")
    r = policy_routing(plan)
    assert "a" in r.unknown and "confidence" in r.unknown["a"]
    assert r.rows["b"] == pytest.approx({"a": 0.25, "b": 0.75})


def test_missing_probabilities_name_the_model_and_the_fix():
    plan = plan_of(HEAD + "route a {\n when confidence < 0.4 -> b\n}\nroute b { -> c }\nroute c { -> a }\n")
    with pytest.raises(
        ThroughputInputError, match=r"for a \(rule 'when confidence < 0.4 -> b'.*--p FROM:TO=PROB"
    ):
        system_from_plan(plan, 4, parse_step_ms(["a=1", "b=2", "c=3"]))
    system = system_from_plan(plan, 4, parse_step_ms(["a=1", "b=2", "c=3"]), parse_p(["a:b=0.2"]))
    assert system.inputs.p[0].tolist() == pytest.approx([0.8, 0.2, 0.0])
    assert system.inputs.p[1].tolist() == pytest.approx([0.0, 0.0, 1.0])
    assert system.auto == ["a", "b"] and system.fixed == {"c": 1}
    assert system.sources["p"] == {"a": "--p", "b": "policy", "c": "policy"}


def test_bad_command_line_values():
    with pytest.raises(ThroughputUsageError):
        parse_p(["a-b=0.1"])
    with pytest.raises(ThroughputUsageError):
        parse_p(["a:b=1.5"])
    with pytest.raises(ThroughputUsageError):
        parse_step_ms(["a=fast"])
    assert parse_step_ms(["a=1:2.0,4:3.0"])["a"].at(2) == pytest.approx(2 + 1 / 3)
    plan = plan_of(HEAD + "route a { -> b }\nroute b { -> c }\nroute c { -> a }\n")
    with pytest.raises(ThroughputInputError, match="no step latency for c"):
        system_from_plan(plan, 4, parse_step_ms(["a=1", "b=2"]))
    with pytest.raises(ThroughputInputError, match="unknown model 'd'"):
        system_from_plan(plan, 4, parse_step_ms(["a=1", "b=2", "c=1", "d=1"]))
    with pytest.raises(ThroughputInputError, match="never routes from a to c"):
        system_from_plan(plan, 4, parse_step_ms(["a=1", "b=2", "c=1"]), parse_p(["a:c=0.1"]))


def test_for_k_hops_from_two_models_keep_their_tokens_and_say_why_the_row_is_needed():
    plan = plan_of(
        'policy t\nmodel slm = "x"\nmodel mid = "y"\nmodel llm = "z"\nentry slm\n'
        "route slm {\n when uniform() < 0.1 -> llm for 1\n when uniform() < 0.3 -> mid\n}\n"
        "route mid {\n when uniform() < 0.2 -> llm for 2\n when uniform() < 0.5 -> slm\n}\n"
    )
    r = policy_routing(plan)
    assert r.keep["llm"] == {"llm": 1.0, "slm": 1.0, "mid": 1.0}
    assert r.unknown["llm"] == (
        "requests arrive by `for K` hops from mid (for 2) and slm (for 1): where one goes back depends on "
        "where it came from"
    )
    with pytest.raises(ThroughputInputError, match=r"for llm \(requests arrive by `for K` hops from mid"):
        system_from_plan(plan, 4, parse_step_ms(["slm=1", "mid=2", "llm=3"]))
    system = system_from_plan(plan, 4, parse_step_ms(["slm=1", "mid=2", "llm=3"]), parse_p(["llm:slm=0.3"]))
    llm, slm, mid = (system.inputs.models.index(m) for m in ("llm", "slm", "mid"))
    assert system.inputs.c[llm, slm] == 1.0 and system.inputs.c[llm, llm] == 1.0
    system = system_from_plan(plan, 4, parse_step_ms(["slm=1", "mid=2", "llm=3"]), parse_p(["llm:mid=0.3"]))
    assert system.inputs.c[llm, mid] == 1.0


def test_for_k_hops_into_a_model_with_rules_of_its_own():
    plan = plan_of(
        HEAD + "route a {\n when uniform() < 0.5 -> b for 3\n when uniform() < 0.2 -> b\n}\n"
        "route b {\n when uniform() < 0.5 -> c\n}\nroute c { -> a }\n"
    )
    r = policy_routing(plan)
    assert r.unknown["b"] == (
        "requests arrive by `for K` hops from a (for 3), and by hops without `for`, and it has rules of its own"
    )
    assert r.keep["b"] == {"b": 1.0, "c": 1.0, "a": 1.0}
