"""`"return_route_inputs": true`: each token's route decisions with what they read, against a real `tokenrouter
serve` of the stdlib's R-Stitch policy (entropy-guided, both models route) on the tiny models, CPU. The inputs
are those the rules decided on; a request that does not ask gets none, and asking changes no token."""

from __future__ import annotations

import json
import signal

import httpx
import pytest
from frontend_helpers import MODELS, ROOT, Server

from tokenrouter.compiler.driver import compile_file
from tokenrouter.runtime import messages as m
from tokenrouter.runtime.frontend.route_inputs import merge_late, token_decisions
from tokenrouter.runtime.subserver.route_inputs import rule_texts

THRESHOLD = (
    0.71  # on the tiny models the small one's normalised entropy is about 0.70-0.73: both models write
)
BODY = {"prompt": "def add(a, b):", "max_tokens": 16, "temperature": 0, "ignore_eos": True,
        "return_routing_trace": True}  # fmt: skip


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("route-inputs")
    defines = [
        f"slm_path={MODELS / 'tiny-small'}",
        f"llm_path={MODELS / 'tiny-large'}",
        f"threshold={THRESHOLD}",
    ]
    srv = Server(
        ROOT / "tokenrouter/stdlib/r_stitch.tr", *[x for d in defines for x in ("-D", d)], log_dir=tmp
    )
    yield srv.url
    assert srv.stop(signal.SIGINT) == 0, srv.stderr()


def _post(url: str, **body) -> dict:
    r = httpx.post(f"{url}/v1/completions", json={**BODY, **body}, timeout=60)
    r.raise_for_status()
    return r.json()["choices"][0]


def test_each_token_has_the_decisions_that_led_to_it(url):
    c = _post(url, return_route_inputs=True)
    routing = c["routing"]
    trace, inputs = routing["trace"], routing["inputs"]
    assert len(inputs) == len(trace) == 16 and {"slm", "llm"} <= set(trace)
    dropped = 0
    for writer, decisions in zip(trace, inputs, strict=True):
        assert decisions[-1]["model"] == writer  # the writer's own decision comes last
        for d in decisions:
            (name,) = d["values"]
            value = d["values"]["norm_entropy"]
            assert name == "norm_entropy" and 0.0 <= value <= 1.0
            # what the rules decided on: slm `norm_entropy > threshold -> llm drop`, llm `<= threshold -> slm`
            if d["model"] == "slm":
                assert d.get("dropped", False) == (value > THRESHOLD) and d.get("to") == (
                    "llm" if value > THRESHOLD else None
                )
            else:
                assert (d.get("to") == "slm") == (value <= THRESHOLD) and "dropped" not in d
        dropped += sum(1 for d in decisions if d.get("dropped"))
        assert all(d.get("dropped") for d in decisions[:-1])  # a dropped token's decision, then the writer's
    assert dropped == routing["hops"] - sum(
        1 for d in sum(inputs, []) if d.get("to") and not d.get("dropped")
    )


def test_rules_as_text_with_their_constants(url):
    info = httpx.get(f"{url}/server_info", timeout=10).json()["subservers"]
    assert info["slm"]["route_rules"] == [f"when norm_entropy > {THRESHOLD:g} -> llm drop"]
    assert info["llm"]["route_rules"] == [f"when norm_entropy <= {THRESHOLD:g} -> slm"]
    plan = compile_file(ROOT / "examples/r2r_kd.tr", {}).plan
    assert rule_texts(plan["routes"]["slm"]) == ["when divergence >= 0.83 -> llm drop for 1"]
    assert rule_texts(plan["routes"]["llm"]) == []
    plan = compile_file(ROOT / "tokenrouter/stdlib/multi_expert.tr", {}).plan
    assert rule_texts(plan["routes"]["a"])[0] == "when (uniform() * ((0.6 + 0.3) + 0.1)) < 0.3 -> b"


def test_absent_unless_asked_and_the_same_tokens(url):
    plain = _post(url, return_token_ids=True)
    asked = _post(url, return_token_ids=True, return_route_inputs=True)
    assert "inputs" not in plain["routing"]
    assert asked["text"] == plain["text"] and asked["routing"]["token_ids"] == plain["routing"]["token_ids"]
    assert asked["routing"]["trace"] == plain["routing"]["trace"]


def test_streamed_chunks_carry_their_tokens_decisions(url):
    body = {**BODY, "stream": True, "return_route_inputs": True}
    inputs, final = [], None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            (c,) = json.loads(line[6:])["choices"]
            if c["finish_reason"]:
                final = c["routing"]
            else:
                assert len(c["routing"]["inputs"]) == len(c["routing"]["trace"])
                inputs += c["routing"]["inputs"]
    assert (
        final is not None
        and inputs == final["inputs"] == _post(url, return_route_inputs=True)["routing"]["inputs"]
    )
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "return_route_inputs": False}, timeout=60
    ) as r:
        assert '"inputs"' not in r.read().decode()


def test_token_decisions_and_a_late_drop():
    keep = m.TokenOut("r", 3, [7], "llm", hop_to="slm", route_inputs=[{"x": 0.5}])
    drop = m.TokenOut("r", 3, [], "slm", hop_to="llm", route_inputs=[{"x": 0.9}])
    assert token_decisions(keep) == [(3, {"model": "llm", "values": {"x": 0.5}, "to": "slm"})]
    assert token_decisions(drop) == [
        (3, {"model": "slm", "values": {"x": 0.9}, "to": "llm", "dropped": True})
    ]
    assert token_decisions(m.TokenOut("r", 0, [1], "slm")) == []
    # the drop's message reached the frontend after the next model's token was taken: merged in before it
    inputs = [[], [], [], [token_decisions(keep)[0][1]]]
    pending = {3: [token_decisions(drop)[0][1]], 9: [{"model": "slm", "values": {}}]}
    merge_late(inputs, pending)
    assert [d["model"] for d in inputs[3]] == ["slm", "llm"] and list(pending) == [9]


def test_a_drop_decision_that_arrives_after_the_next_token_still_comes_first():
    """The next model's token (and its decision) can reach the frontend before the drop hop's message that led
    to it; before the handler takes the token, the drop's decision is put first at that position."""
    from tokenrouter.runtime.frontend.request_manager import ReqState

    keep = m.TokenOut("r", 0, [7], "llm", hop_to="slm", route_inputs=[{"x": 0.5}])
    drop = m.TokenOut("r", 0, [], "slm", hop_to="llm", route_inputs=[{"x": 0.9}])
    for order in ((keep, drop), (drop, keep)):
        st = ReqState("r", prompt_len=1)
        for out in order:
            st.add(out)
        assert [(d["model"], d.get("dropped", False)) for d in st.decisions[0]] == [
            ("slm", True),
            ("llm", False),
        ]
