"""`tokenrouter.Engine` against `tokenrouter serve` on the same policy (tiny models, CPU): the same tokens and
the same routing traces, batched and streamed; its processes stop on close; its mistakes are clear errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import jsonschema
import openai
import pytest
from frontend_helpers import MODELS, Server, write_policy

import tokenrouter

PROMPTS = ["def add(a, b):", "import os\n", "class Stack:"]
SEED = 5
EXTRA = {"ignore_eos": True, "return_routing_trace": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return write_policy(tmp_path_factory.mktemp("api"))


@pytest.fixture(scope="module")
def engine(policy):
    with tokenrouter.Engine(policy, device="cpu") as eng:
        yield eng
    assert not eng.running


@pytest.fixture(scope="module")
def client(policy, tmp_path_factory):
    srv = Server(policy, log_dir=tmp_path_factory.mktemp("api-serve"))
    yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=60)
    assert srv.stop(signal.SIGINT) == 0, srv.stderr()


@pytest.fixture(scope="module")
def served(client):
    return [
        client.completions.create(model="testmix", prompt=p, max_tokens=10, temperature=0, seed=SEED,
                                  extra_body=EXTRA).choices[0]
        for p in PROMPTS
    ]  # fmt: skip


def test_generate_matches_the_server(engine, served):
    sampling = tokenrouter.Sampling(max_tokens=10, temperature=0, seed=SEED, ignore_eos=True)
    got = engine.generate(PROMPTS, sampling)
    assert len(got) == len(PROMPTS)
    for g, ref in zip(got, served, strict=True):
        assert g.text == ref.text
        assert g.token_ids == ref.model_extra["routing"]["token_ids"] and len(g.token_ids) == 10
        assert g.trace == ref.model_extra["routing"]["trace"]
        assert g.finish_reason == "length"
    assert {m for ref in served for m in ref.model_extra["routing"]["trace"]} == {"slm", "llm"}
    # token ids in, the same completion out
    again = engine.generate([list(engine.generate("x", sampling)[0].token_ids)], sampling)
    assert len(again) == 1 and len(again[0].token_ids) == 10


def test_stream_matches_generate(engine, served):
    sampling = tokenrouter.Sampling(max_tokens=10, temperature=0, seed=SEED, ignore_eos=True)

    async def collect():
        return [d async for d in engine.stream(PROMPTS[1], sampling)]

    deltas = asyncio.run(collect())
    last = deltas[-1]
    assert "".join(d.text for d in deltas) == served[1].text
    assert last.finish_reason == "length" and last.trace == served[1].model_extra["routing"]["trace"]
    assert last.token_ids == served[1].model_extra["routing"]["token_ids"]
    assert all(d.finish_reason is None for d in deltas[:-1])


def _same_logprobs(got: list[tokenrouter.TokenLogprob], ref, codec) -> None:
    """`got` (the engine's, by token id) against the HTTP API's completions logprobs (by token text)."""
    assert len(got) == len(ref.token_logprobs)
    for g, text, lp, top in zip(got, ref.tokens, ref.token_logprobs, ref.top_logprobs, strict=True):
        assert codec.tokenizer.decode([g.token_id], skip_special_tokens=False) == text
        assert g.logprob == pytest.approx(lp, abs=1e-4)
        named = {codec.tokenizer.decode([t], skip_special_tokens=False): v for t, v in g.top}
        assert named == pytest.approx(top, abs=1e-4)


def test_generate_logprobs_and_n_match_the_server(engine, client):
    from tokenrouter.runtime.frontend.codec import TextCodec

    codec = TextCodec(MODELS / "tiny-small")
    kw = dict(model="testmix", prompt=PROMPTS[:2], max_tokens=8, temperature=1.0, seed=23, logprobs=3, n=2)
    ref = sorted(client.completions.create(**kw, extra_body=EXTRA).choices, key=lambda c: c.index)
    sampling = tokenrouter.Sampling(max_tokens=8, temperature=1.0, seed=23, ignore_eos=True, n=2,
                                    logprobs=True, top_logprobs=3)  # fmt: skip
    got = engine.generate(PROMPTS[:2], sampling)
    assert len(got) == len(ref) == 4
    for g, r in zip(got, ref, strict=True):
        assert (
            g.token_ids == r.model_extra["routing"]["token_ids"]
            and g.trace == r.model_extra["routing"]["trace"]
        )
        assert [x.token_id for x in g.logprobs] == g.token_ids
        assert all(len(x.top) == 3 for x in g.logprobs)
        _same_logprobs(g.logprobs, r.logprobs, codec)
    assert {m for g in got for m in g.trace} == {"slm", "llm"}  # both models' logprobs are compared
    # choice j of n is the request seeded seed + j, alone
    alone = engine.generate(PROMPTS[1], dataclasses.replace(sampling, n=1, seed=24))[0]
    assert alone.token_ids == got[3].token_ids and alone.trace == got[3].trace
    assert [x.logprob for x in alone.logprobs] == pytest.approx(
        [x.logprob for x in got[3].logprobs], abs=1e-4
    )
    assert got[2].token_ids != got[3].token_ids  # the seeds differ, so do the samples
    plain = engine.generate(PROMPTS[1], dataclasses.replace(sampling, n=1, logprobs=False, top_logprobs=0))
    assert plain[0].logprobs is None and plain[0].token_ids == got[2].token_ids
    assert plain[0].route_inputs is None
    why = engine.generate(PROMPTS[1], dataclasses.replace(sampling, n=1, route_inputs=True))[0]
    assert why.token_ids == got[2].token_ids and len(why.route_inputs) == len(why.token_ids)
    assert all(
        d[-1]["model"] == m and "uniform" in d[-1]["values"]
        for d, m in zip(why.route_inputs, why.trace, strict=True)
    )


def test_prompt_logprobs_match_the_servers_echo(engine, client):
    kw = dict(model="testmix", prompt=PROMPTS[0], max_tokens=4, temperature=0, seed=SEED, logprobs=2)
    ref = client.completions.create(**kw, echo=True, extra_body={**EXTRA, "return_tokens_as_token_ids": True})
    ref = ref.choices[0]
    sampling = tokenrouter.Sampling(max_tokens=4, temperature=0, seed=SEED, ignore_eos=True, top_logprobs=2,
                                    prompt_logprobs=True)  # fmt: skip
    g = engine.generate(PROMPTS[0], sampling)[0]
    n = len(ref.logprobs.tokens) - 4
    assert g.logprobs is None and ref.text == PROMPTS[0] + g.text and len(g.token_ids) == 4
    assert g.prompt_logprobs[0] is None and len(g.prompt_logprobs) == n
    assert [x.token_id for x in g.prompt_logprobs[1:]] == [int(t[9:]) for t in ref.logprobs.tokens[1:n]]
    assert [x.logprob for x in g.prompt_logprobs[1:]] == pytest.approx(
        ref.logprobs.token_logprobs[1:n], abs=1e-5
    )
    assert all(len(x.top) == 2 for x in g.prompt_logprobs[1:])
    # scored only, with the completion's own logprobs asked for too
    only = engine.generate(PROMPTS[0], dataclasses.replace(sampling, max_tokens=0, logprobs=True))[0]
    assert only.text == "" and only.token_ids == [] and only.logprobs == []
    assert [x.logprob for x in only.prompt_logprobs[1:]] == [x.logprob for x in g.prompt_logprobs[1:]]
    with pytest.raises(ValueError, match="prompt_logprobs"):
        asyncio.run(anext(engine.stream(PROMPTS[0], sampling)))


def test_stream_logprobs_and_n(engine):
    sampling = tokenrouter.Sampling(max_tokens=8, temperature=1.0, seed=23, ignore_eos=True, n=2,
                                    logprobs=True, top_logprobs=2)  # fmt: skip
    whole = engine.generate(PROMPTS[1], sampling)

    async def collect():
        return [d async for d in engine.stream(PROMPTS[1], sampling)]

    deltas = asyncio.run(collect())
    for i, g in enumerate(whole):
        mine = [d for d in deltas if d.index == i]
        last = mine[-1]
        assert last.finish_reason == "length" and last.token_ids == g.token_ids and last.trace == g.trace
        pieces = [x for d in mine[:-1] for x in d.logprobs]
        assert [x.token_id for x in pieces] == [x.token_id for x in last.logprobs] == g.token_ids
        assert [x.logprob for x in last.logprobs] == pytest.approx([x.logprob for x in g.logprobs], abs=1e-4)
        assert "".join(d.text for d in mine) == g.text


def test_json_schema_output(engine):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
              "ok": {"type": "boolean"}}, "required": ["n", "ok"], "additionalProperties": False}  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    for g in engine.generate(PROMPTS, tokenrouter.Sampling(max_tokens=40, seed=SEED, response_format=fmt)):
        assert g.finish_reason == "stop"
        jsonschema.validate(json.loads(g.text), schema)


def test_request_errors_are_engine_errors(engine):
    with pytest.raises(tokenrouter.EngineError, match="max_tokens"):
        engine.generate(["x"], tokenrouter.Sampling(max_tokens=0))
    with pytest.raises(ValueError, match="every prompt as text"):
        engine.generate(["x", [1, 2]])
    with pytest.raises(ValueError, match="top_logprobs needs logprobs=True"):
        tokenrouter.Sampling(top_logprobs=2)
    with pytest.raises(tokenrouter.EngineError, match="n must be in"):
        engine.generate(["x"], tokenrouter.Sampling(n=0))


def test_close_stops_every_process(policy):
    eng = tokenrouter.Engine(policy, device="cpu")
    url = eng.url
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    eng.close()
    assert not eng.running
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)
    with pytest.raises(tokenrouter.EngineError, match="closed"):
        eng.generate(["x"])
    eng.close()  # twice is fine


def test_start_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.tr"
    bad.write_text("policy p\nmodel a = 3\n")
    with pytest.raises(tokenrouter.EngineError, match="not compiled"):
        tokenrouter.Engine(bad, device="cpu")
    with pytest.raises(TypeError, match="unknown setting 'devise'"):
        tokenrouter.Engine(bad, devise="cpu")
    with pytest.raises(TypeError, match="'port' is set by the engine"):
        tokenrouter.Engine(bad, port=8000)


def test_interpreter_exit_stops_the_engine(policy):
    script = (
        "import sys, tokenrouter\n"
        f"e = tokenrouter.Engine({str(policy)!r}, device='cpu')\n"
        "print(e._proc.pid, flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    group = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10  # an exited child may stay a zombie a moment, until it is reaped
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)  # the launcher's group: some process of it is left
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"process group {group} outlived the interpreter")
