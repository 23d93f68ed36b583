"""Prompt scoring (`StepInput.prompt_logprobs`, engine/scoring.py): each prompt token's log-probability and the
most likely tokens at its position equal a teacher-forced pass's log-softmax, in a batch with other rows, with a
cached prefix the scored row does not use, and on the scheduler (sent with the request's first step)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.engine.base import EngineError, StepInput
from tokenrouter.runtime.engine.embedded import load_engine
from tokenrouter.runtime.engine.scoring import CHUNK
from tokenrouter.runtime.prefix_cache import PrefixCachingEngine

TINY_SMALL = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-small"
PROMPT = [(11 * i + 5) % 200 + 3 for i in range(40)]


def _reference(engine, tokens: list[int], k: int) -> list:
    logits, _ = engine.forward_full(tokens)
    lp = torch.log_softmax(logits.float(), dim=-1)
    top = lp[:-1].topk(k, dim=-1) if k else None
    return [
        (
            lp[i, tokens[i + 1]].item(),
            top.indices[i].tolist() if k else [],
            top.values[i].tolist() if k else [],
        )
        for i in range(len(tokens) - 1)
    ]


def _check(got: list, want: list) -> None:
    assert len(got) == len(want)
    for (lp, top), (wlp, wids, wvals) in zip(got, want, strict=True):
        assert lp == pytest.approx(wlp, abs=1e-4)
        assert [t for t, _ in top] == wids
        assert [v for _, v in top] == pytest.approx(wvals, abs=1e-4)


@pytest.fixture(scope="module", params=[None, PrefixCachingEngine], ids=["plain", "prefix-cache"])
def engine(request):
    return load_engine(TINY_SMALL, max_tokens=2048, max_batch=8, engine_class=request.param)


def test_scored_rows_equal_the_teacher_forced_log_softmax(engine):
    other = [7, 8, 9, 10, 11]
    out = engine.forward(
        [StepInput("a", other), StepInput("s", PROMPT, prompt_logprobs=3), StepInput("z", PROMPT[:9], 0)]
    )
    assert set(out.prompt_logprobs) == {"s", "z"} and out.logits.shape[0] == 3
    _check(out.prompt_logprobs["s"], _reference(engine, PROMPT, 3))
    _check(out.prompt_logprobs["z"], _reference(engine, PROMPT[:9], 0))
    # the rows' last-position logits are those of an unscored step
    ref_logits, _ = engine.forward_full(PROMPT)
    assert torch.allclose(out.logits[1], ref_logits[-1], atol=1e-4)
    # the next step (a decode) scores nothing, and a scored row's KV is that of a plain one
    nxt = engine.forward([StepInput("s", [PROMPT[0]])])
    assert nxt.prompt_logprobs == {}
    assert torch.allclose(nxt.logits[0], engine.forward_full([*PROMPT, PROMPT[0]])[0][-1], atol=1e-4)
    for rid in ("a", "s", "z"):
        engine.release(rid)
    one = engine.forward(
        [StepInput("one", [5], prompt_logprobs=2), StepInput("two", [5, 6], prompt_logprobs=2)]
    )
    assert (
        one.prompt_logprobs["one"] == [] and len(one.prompt_logprobs["two"]) == 1
    )  # a 1-token prompt: nothing
    engine.release("one")
    engine.release("two")


def test_a_cached_prefix_is_computed_again_for_a_scored_row(engine):
    engine.forward([StepInput("warm", PROMPT)])
    engine.release("warm")  # its blocks stay in the prefix cache, where there is one
    before = engine.stats().get("prefix_matched_tokens", 0)
    out = engine.forward([StepInput("s2", [*PROMPT, 3, 4], prompt_logprobs=2)])
    assert engine.stats().get("prefix_matched_tokens", 0) == before  # no position skipped
    _check(out.prompt_logprobs["s2"], _reference(engine, [*PROMPT, 3, 4], 2))
    engine.release("s2")
    if isinstance(engine, PrefixCachingEngine):  # an unscored row still matches it
        engine.forward([StepInput("u", [*PROMPT, 3, 4])])
        assert engine.stats()["prefix_matched_tokens"] > before
        engine.release("u")


def test_more_positions_than_a_chunk(engine):
    prompt = [(7 * i) % 250 + 2 for i in range(CHUNK + 37)]
    out = engine.forward([StepInput("long", prompt, prompt_logprobs=1)])
    _check(out.prompt_logprobs["long"], _reference(engine, prompt, 1))
    engine.release("long")


def test_scoring_is_a_first_step_thing(engine):
    engine.forward([StepInput("held", [5, 6, 7])])
    with pytest.raises(EngineError, match="first step"):
        engine.forward([StepInput("held", [8, 9], prompt_logprobs=1)])
    engine.release("held")


def test_the_scheduler_sends_the_entry_models_scores_with_the_first_step(engine, tmp_path):
    from tokenrouter.compiler.driver import compile_source
    from tokenrouter.runtime.route import RouteKernel
    from tokenrouter.runtime.subserver.batching import BatchingConfig
    from tokenrouter.runtime.subserver.scheduler import Scheduler

    src = f'policy p "one model"\nmodel a = "{TINY_SMALL}" {{ batch: 1 }}\nentry a\n'
    res = compile_source(src, str(tmp_path / "p.tr"))
    assert res.plan is not None, [str(d) for d in res.diagnostics]
    kernel = RouteKernel(res.plan, "a", "torch", "cpu")
    sched = Scheduler("a", res.plan, engine, kernel, batching=BatchingConfig({"a": 1}, 0.0))
    spec = m.SamplingSpec(max_tokens=0, prompt_logprobs=2)
    sched.handle(m.NewRequest("r0", PROMPT, spec, n_active=2))
    sched.handle(m.NewRequest("r1", PROMPT[:6], m.SamplingSpec(max_tokens=2), n_active=2))
    out = [msg for _, msg in sched.step()]
    step = out[0]
    assert [p.rid for p in step.prompts] == ["r0"]
    _check(step.prompts[0].logprobs, _reference(engine, PROMPT, 2))
    # max_tokens 0: scored, finished, no token; the other request writes as usual
    assert [(f.rid, f.reason) for f in step.finished] == [("r0", "length")]
    assert [t.rid for t in step.tokens] == ["r1"]
    assert not [p for _, msg in sched.step() for p in msg.prompts]
