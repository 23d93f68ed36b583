"""`tokenrouter.Engine` against `tokenrouter serve` on the same policy (tiny models, CPU): the same tokens and
the same routing traces, batched and streamed; its processes stop on close; its mistakes are clear errors."""

from __future__ import annotations

import asyncio
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
from frontend_helpers import Server, write_policy

import tokenrouter

PROMPTS = ["def add(a, b):", "import os\n", "class Stack:"]
SEED = 5


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return write_policy(tmp_path_factory.mktemp("api"))


@pytest.fixture(scope="module")
def engine(policy):
    with tokenrouter.Engine(policy, device="cpu") as eng:
        yield eng
    assert not eng.running


@pytest.fixture(scope="module")
def served(policy, tmp_path_factory):
    srv = Server(policy, log_dir=tmp_path_factory.mktemp("api-serve"))
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=60)
    yield [
        client.completions.create(
            model="testmix", prompt=p, max_tokens=10, temperature=0, seed=SEED,
            extra_body={"ignore_eos": True, "return_routing_trace": True, "return_token_ids": True},
        ).choices[0]
        for p in PROMPTS
    ]  # fmt: skip
    assert srv.stop(signal.SIGINT) == 0, srv.stderr()


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
