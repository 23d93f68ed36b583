"""The HTTP API end to end: the `openai` client against a real `tokenrouter serve` (tiny models, CPU).

One server for the whole module (started from a .tr source, so the on-the-fly compile is covered too), with an
API key. Tests run in file order; each leaves no request active.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from frontend_helpers import Server, metrics, wait_all_pages_free, write_policy

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODELS = ["slm", "llm"]
PROMPTS = ["def add(a, b):", "import os\n", "class Stack:", "for i in range(10):", "x = [", "# sort a list"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    srv = Server(write_policy(tmp), "--api-key", KEY, "--profile-dir", str(tmp / "profiles"), log_dir=tmp)
    srv.run_dir = httpx.get(f"{srv.url}/server_info", headers=AUTH, timeout=10).json()["run_dir"]
    assert os.path.isdir(srv.run_dir)
    yield srv
    assert srv.stop(signal.SIGINT) == 0, srv.stderr()  # (the last test already stopped it, with Ctrl-C)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)


def _check_routing(choice_extra: dict, completion_tokens: int) -> dict:
    routing = choice_extra["routing"]
    assert set(routing["tokens_per_model"]) == set(MODELS)
    assert sum(routing["tokens_per_model"].values()) == completion_tokens
    assert routing["hops"] >= 0
    return routing


def test_health_models_and_auth(server, client):
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200  # open without the key
    models = client.models.list()
    assert [m.id for m in models.data] == ["testmix"]
    assert client.models.retrieve("testmix").id == "testmix"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    r = httpx.get(f"{server.url}/v1/models", timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="testmix", prompt="x", max_tokens=1)


def test_completion_usage_and_routing(client):
    r = client.completions.create(
        model="testmix",
        prompt=PROMPTS[0],
        max_tokens=12,
        temperature=0,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    (choice,) = r.choices
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert r.usage.prompt_tokens > 0
    routing = _check_routing(choice.model_extra, 12)
    assert "trace" not in routing
    assert isinstance(choice.text, str)


def test_routing_trace_and_both_models_write(client):
    per_model = {x: 0 for x in MODELS}
    for seed in range(3):
        r = client.completions.create(
            model="testmix",
            prompt=PROMPTS[1],
            max_tokens=8,
            temperature=0,
            seed=seed,
            extra_body={"ignore_eos": True, "return_routing_trace": True},
        )
        routing = _check_routing(r.choices[0].model_extra, r.usage.completion_tokens)
        trace = routing["trace"]
        assert len(trace) == r.usage.completion_tokens == 8
        assert {x: trace.count(x) for x in MODELS} == routing["tokens_per_model"]
        for x in MODELS:
            per_model[x] += trace.count(x)
    assert per_model["slm"] > 0 and per_model["llm"] > 0, per_model


def test_same_seed_same_output(client):
    kw = dict(model="testmix", prompt=PROMPTS[2], max_tokens=8, temperature=1.0, seed=1234)
    kw["extra_body"] = {"ignore_eos": True, "return_routing_trace": True}
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].model_extra["routing"] == b.choices[0].model_extra["routing"]


def test_chat_plain_and_streamed_agree(client):
    kw = dict(model="testmix", messages=[{"role": "user", "content": "Write a function."}], max_tokens=10)
    kw.update(temperature=0, seed=3, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    assert full.choices[0].message.role == "assistant"
    assert full.usage.completion_tokens == 10
    _check_routing(full.choices[0].model_extra, 10)

    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert finals[0].choices[0].model_extra["routing"] == full.choices[0].model_extra["routing"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_completion_stream_without_usage(client):
    chunks = list(
        client.completions.create(
            model="testmix", prompt=PROMPTS[3], max_tokens=6, temperature=0, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_prompt_forms(client):
    ids = [5, 17, 42, 99]
    a = client.completions.create(model="testmix", prompt=ids, max_tokens=4, temperature=0, seed=1)
    assert a.usage.prompt_tokens == 4
    both = client.completions.create(
        model="testmix",
        prompt=[ids, [7, 8]],
        max_tokens=4,
        temperature=0,
        seed=1,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in both.choices] == [0, 1]
    assert both.usage.prompt_tokens == 6 and both.usage.completion_tokens == 8
    texts = client.completions.create(model="testmix", prompt=PROMPTS[:3], max_tokens=3, temperature=0)
    assert sorted(c.index for c in texts.choices) == [0, 1, 2]


def test_stop_string_cuts_and_aborts(server, client):
    kw = dict(model="testmix", prompt=PROMPTS[0], max_tokens=16, temperature=0, seed=5)
    kw["extra_body"] = {"ignore_eos": True}
    full = client.completions.create(**kw).choices[0].text
    if len(full) < 4:
        pytest.skip(f"the tiny model wrote too little text to pick a stop string from: {full!r}")
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = full[: full.index(stop)]
    before = metrics(server.url)
    r = client.completions.create(**kw, stop=[stop])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens <= 16
    _check_routing(r.choices[0].model_extra, r.usage.completion_tokens)
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(**kw, stop=stop, stream=True) if c.choices
    )
    assert streamed == cut
    after = wait_all_pages_free(server.url, MODELS)
    key = 'tokenrouter_requests_finished_total{reason="stop"}'
    assert after.get(key, 0) >= before.get(key, 0) + 2


_CHAT = "/v1/chat/completions"
_HI = {"role": "user", "content": "hi"}


def _chat(messages: list, **fields) -> str:
    return json.dumps({**fields, "messages": messages})


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", "{not json", 400, None),
        ("/v1/completions", "[1, 2]", 400, None),
        ("/v1/completions", '{"prompt": 3}', 400, "prompt"),
        ("/v1/completions", '{"prompt": "x", "max_tokens": "5"}', 400, "max_tokens"),
        ("/v1/completions", '{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
        ("/v1/completions", '{"prompt": "x", "temperature": "hot"}', 400, "temperature"),
        ("/v1/completions", '{"prompt": "x", "model": "gpt-4"}', 404, "model"),
        ("/v1/completions", '{"prompt": ""}', 400, "prompt"),
        ("/v1/completions", '{"prompt": []}', 400, "prompt"),
        ("/v1/completions", '{"prompt": [1, -4]}', 400, "prompt"),
        ("/v1/completions", '{"prompt": "x", "n": 0}', 400, "n"),
        ("/v1/completions", '{"prompt": "x", "max_tokens": 100000}', 400, "max_tokens"),
        ("/v1/completions", '{"prompt": "x", "logprobs": 21}', 400, "logprobs"),
        ("/v1/chat/completions", '{"messages": []}', 400, "messages"),
        ("/v1/chat/completions", '{"messages": [{"content": "hi"}]}', 400, "messages[0].role"),
        ("/v1/chat/completions", '{"messages": "hi"}', 400, "messages"),
        (_CHAT, _chat([{"role": "wizard", "content": "hi"}], max_tokens=4), 400, "messages[0].role"),
        (_CHAT, _chat([{"role": "user"}], max_tokens=4), 400, "messages[0].content"),
        (_CHAT, _chat([{"role": "user", "content": None}]), 400, "messages[0].content"),
        (_CHAT, _chat([_HI, {"role": "tool", "content": "1"}]), 400, "tools"),  # the template renders none
        (_CHAT, _chat([_HI, {"role": "assistant", "content": None}]), 400, "messages[1].content"),
        (
            _CHAT,
            _chat([{"role": "user", "content": [{"type": "image_url"}]}]),
            400,
            "messages[0].content[0].type",
        ),
        (_CHAT, _chat([_HI], max_tokens=4, max_completion_tokens=-3), 400, "max_completion_tokens"),
        (_CHAT, _chat([_HI], max_completion_tokens=0), 400, "max_completion_tokens"),
        (_CHAT, _chat([_HI], max_tokens=4, max_completion_tokens=100000), 400, "max_completion_tokens"),
    ],
)
def test_bad_requests_get_openai_errors(server, path, body, status, param):
    r = httpx.post(f"{server.url}{path}", content=body, headers=AUTH, timeout=10)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["message"]
    assert "Traceback" not in r.text


def test_prompt_longer_than_context(server, client):
    max_len = client.models.list().data[0].model_extra["max_model_len"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="testmix", prompt=[1] * max_len, max_tokens=1)
    assert "context length" in str(e.value)
    assert httpx.get(f"{server.url}/nope", timeout=10, headers=AUTH).status_code == 404


def test_chat_text_parts_developer_role_and_max_completion_tokens(client):
    kw = dict(model="testmix", temperature=0, seed=11, extra_body={"ignore_eos": True})
    plain = client.chat.completions.create(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        max_tokens=3, **kw,
    )  # fmt: skip
    parts = client.chat.completions.create(
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},  # rendered as system
            {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
        ],
        max_tokens=9, max_completion_tokens=3, **kw,  # max_completion_tokens wins
    )  # fmt: skip
    assert parts.usage == plain.usage and parts.usage.completion_tokens == 3
    assert parts.choices[0].message.content == plain.choices[0].message.content


def test_a_huge_prompt_is_tokenized_off_the_event_loop(server):
    """4 MB of prompt takes the tokenizer about a second (before, on the event loop, 2 s during which /health
    waited); meanwhile the server answers, and the prompt gets its context_length_exceeded."""
    result: dict = {}

    def post() -> None:
        body = {"model": "testmix", "prompt": "a" * 4_000_000, "max_tokens": 1}
        result["r"] = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=60)

    t = threading.Thread(target=post)
    waits = []
    with httpx.Client(timeout=30) as probe:
        assert probe.get(f"{server.url}/health").status_code == 200
        t.start()
        while t.is_alive():
            t0 = time.monotonic()
            assert probe.get(f"{server.url}/health").status_code == 200
            waits.append(time.monotonic() - t0)
    t.join()
    r = result["r"]
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert r.json()["error"]["param"] == "prompt"
    assert waits and max(waits) < 0.5, f"/health waited {max(waits):.2f} s"


def test_a_body_over_the_limit_gets_413_before_it_is_read(server):
    """Content-Length above the limit (16 MiB): a 413 at once, without waiting for a body never sent."""
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.putrequest("POST", "/v1/completions")
        headers = {**AUTH, "Content-Type": "application/json", "Content-Length": str(1 << 30)}
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        r = conn.getresponse()
        status, err = r.status, json.loads(r.read())["error"]
    finally:
        conn.close()
    assert status == 413 and err["code"] == "request_too_large" and err["type"] == "invalid_request_error"
    assert str(16 << 20) in err["message"]


def test_concurrent_requests_match_sequential(client):
    kws = [
        dict(model="testmix", prompt=p, max_tokens=8, temperature=0, seed=i,
             extra_body={"ignore_eos": True, "return_routing_trace": True})
        for i, p in enumerate(PROMPTS[:4])
    ]  # fmt: skip
    sequential = [client.completions.create(**kw) for kw in kws]
    with ThreadPoolExecutor(len(kws)) as pool:
        concurrent = list(pool.map(lambda kw: client.completions.create(**kw), kws))
    for s, c in zip(sequential, concurrent, strict=True):
        assert c.choices[0].text == s.choices[0].text
        assert c.choices[0].model_extra["routing"] == s.choices[0].model_extra["routing"]


def test_load_generator_open_loop_against_the_server(server):
    """`tokenrouter bench`'s open loop on the real server: a warm-up that is not counted, then Poisson arrivals
    at most 3 in flight; every token is counted once, by the model that wrote it."""
    from tokenrouter.loadgen.bench import LoadSpec, run_load

    spec = LoadSpec(url=server.url, api_key=KEY, request_rate=20.0, concurrency=3, warmup=2, num_prompts=6,
                    output_len=8, prompt_len=5, vocab_high=100, progress=False)  # fmt: skip
    report = asyncio.run(run_load(spec))
    assert report["completed"] == 6 and report["failed"] == 0, report["errors"]
    assert report["warmup"] == {"requests": 2, "failed": 0, "errors": []}
    assert report["output_tokens"] == 48 and sum(report["tokens_per_model"].values()) == 48
    assert set(report["tokens_per_model"]) <= set(MODELS) and 1 <= report["max_in_flight"] <= 3
    assert all(r["ok"] and r["ttft_s"] <= r["e2e_s"] for r in report["per_request"])


def test_server_matches_the_sequential_reference(server, client):
    """Routing is exact through HTTP: greedy text and per-token model trace equal the plain sequential reference
    (one request at a time, no batching, no KV cache) of the very plan the server runs, at concurrency 1 and 8."""
    from tokenrouter.compiler.plan import read_plan
    from tokenrouter.runtime.frontend.codec import TextCodec
    from tokenrouter.runtime.messages import SamplingSpec
    from tokenrouter.runtime.reference import ReferenceModel, reference_generate
    from tokenrouter.runtime.subserver.loading import load_model_runtime

    plan = read_plan(os.path.join(server.run_dir, "plan.json"))
    loaded = {x: load_model_runtime(plan, x, "cpu") for x in plan["models"]}
    refs = {x: ReferenceModel.from_engine(engine) for x, (engine, _) in loaded.items()}
    kernels = {x: kernel for x, (_, kernel) in loaded.items()}
    codec = TextCodec(plan["models"][plan["entry"]]["path"])
    prompts = [[(7 * i + j * 5) % 500 + 3 for j in range(2 + i % 5)] for i in range(8)]

    def ask(i: int):
        return client.completions.create(
            model="testmix", prompt=prompts[i], max_tokens=10, temperature=0, seed=100 + i,
            extra_body={"ignore_eos": True, "return_routing_trace": True},
        )  # fmt: skip

    alone = [ask(i) for i in range(2)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, range(8)))
    hops = 0
    for i, r in enumerate(together):
        spec = SamplingSpec(temperature=0.0, seed=100 + i, max_tokens=10, ignore_eos=True)
        ref = reference_generate(plan, refs, kernels, prompts[i], spec)
        choice = r.choices[0]
        assert choice.model_extra["routing"]["trace"] == ref.models, i
        assert choice.model_extra["routing"]["hops"] == len(ref.hops), i
        assert choice.text == codec.tokenizer.decode(ref.token_ids, skip_special_tokens=True), i
        assert choice.finish_reason == ref.finish_reason
        hops += len(ref.hops)
    assert hops > 0
    for a, b in zip(alone, together, strict=False):
        assert (a.choices[0].text, a.choices[0].model_extra) == (b.choices[0].text, b.choices[0].model_extra)


def test_client_disconnects_free_every_kv_pool(server):
    body = {"model": "testmix", "prompt": PROMPTS[4], "max_tokens": 2000, "ignore_eos": True, "stream": True}
    before = metrics(server.url)
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=30) as r:
        assert r.status_code == 200
        got = 0
        for line in r.iter_lines():
            got += line.startswith("data: {")
            if got >= 3:
                break  # leave mid-stream: closing the response disconnects
    # A non-streamed request whose client gives up.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json={**body, "stream": False}, headers=AUTH, timeout=1.0)
    after = wait_all_pages_free(server.url, MODELS)
    key = 'tokenrouter_requests_finished_total{reason="abort"}'
    assert after.get(key, 0) >= before.get(key, 0) + 2


def test_metrics_name_the_plan_and_a_profile_of_another_routing_is_refused(server, tmp_path):
    """`tokenrouter_plan_info` carries the served plan's routing digest; `profile --from-metrics` takes the
    server's metrics for its own policy and refuses them for one of the same models that routes otherwise
    (here `uniform() < 0.5` where the server's says 0.3), which the model names alone cannot tell apart."""
    from tokenrouter.compiler.driver import load_plan
    from tokenrouter.compiler.plan import routing_digest

    policy = server.plan
    mine = routing_digest(load_plan(policy))
    assert metrics(server.url)[f'tokenrouter_plan_info{{policy="testmix",routing="{mine}"}}'] == 1
    other = tmp_path / "other.tr"
    other.write_text(open(policy).read().replace("uniform() < 0.3", "uniform() < 0.5"))

    def profile(plan, key: str | None = KEY) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "TOKENROUTER_API_KEY"}
        if key is not None:  # the server's JSON stats (/v1/stats) need its key, as every API endpoint does
            env["TOKENROUTER_API_KEY"] = key
        return subprocess.run([sys.executable, "-m", "tokenrouter.cli", "profile", str(plan), "--from-metrics",
                               server.url, "--min-steps", "1", "-o", str(tmp_path / "p.json")],
                              capture_output=True, text=True, timeout=120, env=env)  # fmt: skip

    keyless = profile(policy, key=None)
    assert (
        keyless.returncode == 1 and "HTTP 401 (set TOKENROUTER_API_KEY to the server's key)" in keyless.stderr
    )
    ok = profile(policy)
    assert ok.returncode == 0, ok.stderr
    refused = profile(other)
    assert refused.returncode == 1  # an input error, as metrics of other models are
    assert (
        "the metrics are of a server of policy 'testmix', which routes otherwise than this plan's"
        in refused.stderr
    )
    assert "Traceback" not in refused.stderr


def test_a_live_profile_writes_each_subservers_trace(server, client, tmp_path):
    """POST /start_profile, a request, POST /stop_profile: each subserver writes a Chrome trace of its steps,
    with the scheduler's phases marked, and a table of ops, into --profile-dir; the answer names the files. The
    profile's state is checked (409), and the endpoints need the API key."""
    url = server.url
    assert httpx.post(f"{url}/start_profile", timeout=10).status_code == 401
    off = httpx.post(f"{url}/stop_profile", headers=AUTH, timeout=10)
    assert (
        off.status_code == 409
        and off.json()["error"]["message"] == "no profile is running; POST /start_profile first"
    )
    started = httpx.post(f"{url}/start_profile", headers=AUTH, timeout=60)
    assert started.status_code == 200, started.text
    assert started.json() == {
        "profiling": True,
        "models": MODELS,
        "profile_dir": str(server.plan.parent / "profiles"),
    }
    again = httpx.post(f"{url}/start_profile", headers=AUTH, timeout=10)
    assert again.status_code == 409 and again.json()["error"]["code"] == "profile_state"
    r = client.completions.create(model="testmix", prompt=PROMPTS[1], max_tokens=12, temperature=0, seed=3,
                                  extra_body={"ignore_eos": True})  # fmt: skip
    assert r.usage.completion_tokens == 12
    stopped = httpx.post(f"{url}/stop_profile", headers=AUTH, timeout=120)
    assert stopped.status_code == 200, stopped.text
    files = stopped.json()["files"]
    assert set(files) == set(MODELS)
    phases = set()
    for model, (trace, table) in files.items():
        assert os.path.dirname(trace) == str(server.plan.parent / "profiles") and f"-{model}-" in trace
        events = json.loads(open(trace).read())["traceEvents"]
        phases |= {e["name"] for e in events if e.get("name", "").startswith("tokenrouter.")}
        assert "Name" in open(table).read()
    assert phases == {"tokenrouter.forward", "tokenrouter.route", "tokenrouter.commit"}
    assert httpx.post(f"{url}/stop_profile", headers=AUTH, timeout=10).status_code == 409


def test_metrics_content(server):
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    for name in ("requests_total", "requests_active", "generation_tokens_total", "hops_total", "queue_waiting",
                 "queue_pending", "batch_size", "step_latency_seconds", "kv_pages_free"):  # fmt: skip
        assert f"# TYPE tokenrouter_{name} " in text, name
    mt = metrics(server.url)
    assert mt['tokenrouter_generation_tokens_total{model="slm"}'] > 0
    assert mt['tokenrouter_generation_tokens_total{model="llm"}'] > 0
    assert mt['tokenrouter_hops_total{from="slm",to="llm"}'] > 0
    assert mt['tokenrouter_step_latency_seconds{model="slm"}'] > 0
    # the thresholds as configured (the policy's `batch: 2` and `batch: 1`)
    assert (
        mt['tokenrouter_batch_threshold{model="slm"}'] == 2
        and mt['tokenrouter_batch_threshold{model="llm"}'] == 1
    )
    # every step counted once by why it started; the llm's B = 1 is always reached
    for model in ("slm", "llm"):
        starts = {r: mt.get(f'tokenrouter_step_starts_total{{model="{model}",reason="{r}"}}', 0)
                  for r in ("threshold", "lowered", "held", "timeout")}  # fmt: skip
        assert sum(starts.values()) == mt[f'tokenrouter_steps_total{{model="{model}"}}'] > 0, (model, starts)
    assert mt['tokenrouter_step_starts_total{model="llm",reason="threshold"}'] > 0
    assert mt['tokenrouter_step_starts_total{model="llm",reason="timeout"}'] == 0
    # both models on the one device: the busy board counts the steps of each that no step of the other overlapped
    alone = {
        model: sum(
            v
            for k, v in mt.items()
            if k.startswith(f'tokenrouter_alone_steps_by_batch_total{{model="{model}"')
        )
        for model in ("slm", "llm")
    }
    for model, n in alone.items():
        assert n <= mt[f'tokenrouter_steps_total{{model="{model}"}}'], (model, n)
    assert sum(alone.values()) > 0, alone
    # every step counted once by its shape: the prompts' prefills (q > 1) and decodes (q = 1), alone or
    # overlapped by the other model's (stalls are not expected here)
    for model in ("slm", "llm"):
        shapes = {
            k: v for k, v in mt.items() if k.startswith(f'tokenrouter_steps_by_shape_total{{model="{model}"')
        }
        assert sum(shapes.values()) == mt[f'tokenrouter_steps_total{{model="{model}"}}'], (model, shapes)
        lone = sum(v for k, v in shapes.items() if k.endswith('overlap="alone"}'))
        assert lone == alone[model], (model, shapes)
    assert any(',q="1",' in k and v > 0 for k, v in mt.items() if k.startswith("tokenrouter_steps_by_shape"))
    assert any(
        ',q="1",' not in k and v > 0 for k, v in mt.items() if k.startswith("tokenrouter_steps_by_shape")
    )
    done = mt['tokenrouter_requests_finished_total{reason="length"}']
    assert mt["tokenrouter_e2e_request_latency_seconds_count"] >= done > 0
    # of the ended requests, those each model wrote a token of: both models wrote some, none more than ended
    ended = mt["tokenrouter_e2e_request_latency_seconds_count"]
    visits = {x: mt[f'tokenrouter_requests_visiting_total{{model="{x}"}}'] for x in ("slm", "llm")}
    assert all(0 < v <= ended for v in visits.values()) and sum(visits.values()) >= ended, (visits, ended)
    assert mt["tokenrouter_time_to_first_token_seconds_count"] >= done


def test_soak_concurrency_32_with_leavers_no_error_no_leak(server):
    n_requests, concurrency = 200, 32
    aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)
    before = metrics(server.url)

    async def one(i: int, sem: asyncio.Semaphore):
        async with sem:
            if i % 10 == 5:  # a client that leaves after its first chunk
                stream = await aclient.completions.create(
                    model="testmix", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=4000, stream=True,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
                async for _ in stream:
                    break
                await stream.close()
                return None
            if i % 2:
                r = await aclient.completions.create(
                    model="testmix", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=3, temperature=0.8, seed=i,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
                return r.usage.completion_tokens, r.choices[0].model_extra
            chunks = [
                c
                async for c in await aclient.chat.completions.create(
                    model="testmix", messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=3, stream=True,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
                )
            ]  # fmt: skip
            final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
            return chunks[-1].usage.completion_tokens, final.choices[0].model_extra

    async def main():
        sem = asyncio.Semaphore(concurrency)
        try:
            return await asyncio.gather(*(one(i, sem) for i in range(n_requests)))
        finally:
            await aclient.close()

    t0 = time.monotonic()
    results = asyncio.run(main())
    elapsed = time.monotonic() - t0
    assert len(results) == n_requests
    left = [r for r in results if r is None]
    assert len(left) == n_requests // 10
    for tokens, extra in (r for r in results if r is not None):
        assert tokens == 3
        _check_routing(extra, 3)
    after = wait_all_pages_free(server.url, MODELS)
    assert after["tokenrouter_requests_total"] - before["tokenrouter_requests_total"] == n_requests
    key = 'tokenrouter_requests_finished_total{reason="abort"}'
    assert after[key] - before.get(key, 0) == len(left)
    assert elapsed < 60, f"soak took {elapsed:.1f} s"


def test_ctrl_c_fails_requests_in_flight_and_shuts_down_cleanly(server, client):
    """Last in this module: Ctrl-C (SIGINT to the launcher's process group) while requests are in flight."""
    outcomes: list[str] = []

    def streamed() -> None:
        try:
            for _ in client.completions.create(
                model="testmix",
                prompt=PROMPTS[0],
                max_tokens=4000,
                stream=True,
                extra_body={"ignore_eos": True},
            ):
                started.set()
            outcomes.append("finished")
        except openai.APIError as e:
            outcomes.append(str(e))

    started = threading.Event()
    t = threading.Thread(target=streamed)
    t.start()
    assert started.wait(30)
    t0 = time.monotonic()
    assert server.stop(signal.SIGINT) == 0, server.stderr()
    t.join(10)
    assert outcomes and "shutting down" in outcomes[0], outcomes
    assert time.monotonic() - t0 < 20
    assert not os.path.exists(server.run_dir), "the run directory was not removed"
