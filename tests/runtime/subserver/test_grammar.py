"""Constrained decoding across hops: with a JSON-schema grammar in its sampling settings, every request's
completion parses and validates and ends with "stop", whichever models wrote its tokens, for every stdlib
policy on the tiny models, the hand-off forms (drop, `for K`, three models) and the std-serving baseline (whose
receiver rebuilds the request from the whole sequence). The in-process executor runs the subservers'
schedulers, as `tokenrouter serve` does."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from subserver_helpers import SMALL, STDLIB_DEFINES, compile_policy, compile_stdlib
from tokenizers import Tokenizer

from tokenrouter.runtime import grammar
from tokenrouter.runtime.baselines.std_serving import StdServingScheduler
from tokenrouter.runtime.messages import SamplingSpec
from tokenrouter.runtime.offline import load_offline
from tokenrouter.runtime.route import RouteBatchState, RouteKernel

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
    },
    "required": ["name", "ok", "n", "tags"],
    "additionalProperties": False,
}
PROMPTS = [[5 + i, 17, 33 + 7 * i] for i in range(8)]


def check_json(ex, spec_kw: dict | None = None, every_model: bool = False) -> None:
    g = grammar.from_json_schema(SCHEMA)
    specs = [
        SamplingSpec(seed=i, max_tokens=100, temperature=(0.0, 1.0)[i % 2], grammar=g, **(spec_kw or {}))
        for i in range(len(PROMPTS))
    ]
    tok = Tokenizer.from_file(f"{SMALL}/tokenizer.json")
    results = ex.generate(PROMPTS, specs)
    for r in results:
        assert r.finish_reason == "stop", (r.error, tok.decode(r.token_ids))
        jsonschema.validate(json.loads(tok.decode(r.token_ids)), SCHEMA)
    assert sum(len(r.hops) for r in results) > 0
    if every_model:
        assert {m for r in results for m in r.models} == set(ex.plan["models"])


@pytest.mark.parametrize("policy", sorted(STDLIB_DEFINES))
def test_json_schema_output_validates_for_every_stdlib_policy(tmp_path, policy):
    check_json(load_offline(compile_stdlib(tmp_path, policy), "cpu"))


@pytest.mark.parametrize("policy", ["drop", "for_k", "three"])
def test_json_schema_output_validates_for_every_hand_off_form(tmp_path, policy):
    check_json(
        load_offline(compile_policy(tmp_path, policy, batch={"a": 3, "b": 2}), "cpu"), every_model=True
    )


def test_top_k_top_p_and_ignore_eos_keep_to_the_grammar(tmp_path):
    ex = load_offline(compile_policy(tmp_path, "keep", batch={"a": 2, "b": 2}), "cpu")
    check_json(ex, {"top_k": 5, "top_p": 0.9, "ignore_eos": True})


def test_std_serving_rebuilds_the_matcher_from_the_whole_sequence(tmp_path):
    ex = load_offline(compile_policy(tmp_path, "keep"), "cpu")
    ex.schedulers = {
        x: StdServingScheduler(x, ex.plan, s.engine, s.kernel, clock=ex.clock)
        for x, s in ex.schedulers.items()
    }
    check_json(ex)


def test_a_grammar_error_fails_only_its_request(tmp_path):
    ex = load_offline(compile_policy(tmp_path, "keep"), "cpu")
    bad = grammar.from_lark("start: nope")  # an unknown rule: llguidance does not compile it
    free = SamplingSpec(seed=1, max_tokens=6, ignore_eos=True)
    ok, failed = ex.generate(PROMPTS[:2], [free, SamplingSpec(seed=2, max_tokens=6, grammar=bad)])
    assert ok.finish_reason == "length" and len(ok.token_ids) == 6
    assert failed.finish_reason == "error" and "grammar" in failed.error


def test_forced_tokens_take_the_kernels_draw_and_their_logprob(tmp_path):
    plan = compile_policy(tmp_path, "keep")
    kernel = RouteKernel(plan, "a", "torch")
    logits = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    state = RouteBatchState.make(3, temperature=[0.0, 1.0, 0.0], seed=[1, 2, 3], position=[4, 5, 6])
    free = kernel(logits, None, state)
    forced = torch.tensor([-1, 7, 300])
    out = kernel(logits, None, state, forced=forced)
    assert out.token.tolist() == [free.token[0].item(), 7, 300]
    lp = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(out.logprob, lp.gather(1, out.token[:, None])[:, 0], atol=1e-5)
