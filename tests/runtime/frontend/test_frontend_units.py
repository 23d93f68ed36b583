"""Frontend pieces without processes: token reordering, stop strings, request validation, chat template."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import msgspec
import pytest
from frontend_helpers import MODELS
from starlette.requests import Request

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.frontend.body import check_json_type, read_json_body
from tokenrouter.runtime.frontend.codec import TemplateError, TextCodec
from tokenrouter.runtime.frontend.config import MAX_BODY_BYTES, FrontendArgs
from tokenrouter.runtime.frontend.generation import Choice
from tokenrouter.runtime.frontend.handlers import GenerationHandler
from tokenrouter.runtime.frontend.metrics import Metrics
from tokenrouter.runtime.frontend.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_body,
)
from tokenrouter.runtime.frontend.request_manager import ReqState

CODEC = TextCodec(MODELS / "tiny-small")


def test_tokens_out_of_order_are_reordered():
    st = ReqState(rid="r", prompt_len=3)
    st.add(m.TokenOut(rid="r", index=0, token_ids=[10, 11], model="slm", hop_to="llm"))
    st.add(m.TokenOut(rid="r", index=3, token_ids=[13], model="slm"))  # arrives before index 2
    assert st.take() == [(10, "slm"), (11, "slm")]
    st.finish_reason = "length"
    assert not st.done  # index 2 is still missing
    st.add(m.TokenOut(rid="r", index=2, token_ids=[12], model="llm", hop_to="slm"))
    assert st.take() == [(12, "llm"), (13, "slm")]
    assert st.done and st.hops == [("slm", "llm"), ("llm", "slm")]
    st.add(m.TokenOut(rid="r", index=1, token_ids=[11], model="slm"))  # a duplicate is ignored
    assert st.take() == []


class _Aborts:
    """Stands in for the RequestManager: records the aborts a choice issues."""

    def __init__(self) -> None:
        self.aborted: list[tuple[str, str]] = []

    def abort(self, rid: str, reason: str = "abort") -> None:
        self.aborted.append((rid, reason))


def _run_choice(
    text: str, stop: list[str], chunk: int = 1, chunk_trace: bool = False
) -> tuple[list[str], Choice, _Aborts]:
    ids = CODEC.encode(text, add_special_tokens=False)

    async def go():
        st = ReqState(rid="r", prompt_len=1)
        mgr = _Aborts()
        c = Choice(mgr, CODEC, st, 0, stop, ["slm", "llm"], want_trace=True, chunk_trace=chunk_trace)
        for i in range(0, len(ids), chunk):
            st.add(
                m.TokenOut(rid="r", index=i, token_ids=ids[i : i + chunk], model="slm" if i % 2 else "llm")
            )
        st.finish_reason = "length"
        st.event.set()
        return [d async for d in c.deltas()], c, mgr

    return asyncio.run(go())


def test_stop_string_cuts_text_and_aborts_everywhere():
    deltas, c, mgr = _run_choice("def add(a, b):\n    return a + b\n", stop=["return"])
    assert "".join(deltas) == c.text == "def add(a, b):\n    "
    assert c.finish_reason == "stop" and mgr.aborted == [("r", "stop")]
    assert c.completion_tokens == len(c.trace) == sum(c.routing()["tokens_per_model"].values())


def test_no_stop_string_keeps_everything_and_unicode():
    text = "x = 'wörld' # 😀 done"
    deltas, c, mgr = _run_choice(text, stop=["never"], chunk=3)
    assert "".join(deltas) == c.text == text
    assert c.finish_reason == "length" and mgr.aborted == []


def test_each_streamed_increment_has_the_models_and_text_of_its_tokens():
    text = "x = 'wörld' # 😀 done"
    deltas, c, _ = _run_choice(text, stop=[], chunk=3, chunk_trace=True)
    chunks = [c.chunk_routing() for _ in deltas]
    assert not c.chunks  # one per increment
    assert deltas == ["".join(r["pieces"]) for r in chunks]
    assert sum((r["trace"] for r in chunks), []) == c.trace and len(c.trace) == c.completion_tokens
    assert all(len(r["trace"]) == len(r["pieces"]) for r in chunks)
    _, c, _ = _run_choice(text, stop=[], chunk=3)  # not streamed: nothing kept per increment
    assert not c.chunks and len(c.trace) == c.completion_tokens


def test_stop_string_spanning_tokens_is_never_streamed():
    deltas, c, _ = _run_choice("abcdefgh", stop=["def"])
    assert c.text == "abc" and all("d" not in d for d in deltas)


def test_parse_body_types_and_limits():
    req = parse_body(CompletionRequest, b'{"prompt": [[1, 2], [3]], "top_k": 5, "seed": -3, "stop": "x"}')
    assert req.prompt == [[1, 2], [3]] and req.stop_strings() == ["x"]
    for body, param in [
        (b'{"prompt": "a", "top_p": 0}', "top_p"),
        (b'{"prompt": "a", "stream": "yes"}', "stream"),
        (b'{"prompt": "a", "stop": ["", "b"]}', "stop"),
        (b'{"prompt": "a", "presence_penalty": 0.5}', "presence_penalty"),
        (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "messages[0].content"),
    ]:
        model = ChatCompletionRequest if b"messages" in body else CompletionRequest
        with pytest.raises(APIError) as e:
            parse_body(model, body)
        assert e.value.status == 400 and (e.value.param or "").startswith(param), (body, e.value.param)
    chat = parse_body(
        ChatCompletionRequest,
        b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4}',
    )
    assert chat.completion_limit() == (4, "max_completion_tokens")


_HI = '{"role": "user", "content": "hi"}'


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ('[{"role": "wizard", "content": "hi"}]', "messages[0].role"),
        ('[{"content": "hi"}]', "messages[0].role"),
        ('[{"role": 3, "content": "hi"}]', "messages[0].role"),
        ('[{"role": "function", "name": "f", "content": "42"}]', "messages[0].role"),
        ('[{"role": "user"}]', "messages[0].content"),
        ('[{"role": "user", "content": null}]', "messages[0].content"),
        (f'[{_HI}, {{"role": "assistant", "content": null}}]', "messages[1].content"),
        (f'[{_HI}, {{"role": "assistant", "content": null, "tool_calls": [{{"id": "c1"}}]}}]',
         "messages[1].tool_calls[0].function"),
        (f'[{_HI}, {{"role": "user", "content": "x", "tool_calls": []}}, {{"role": "user", "content": "x", '
         '"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]', "messages[2].tool_calls"),
        ('[{"role": "user", "content": []}]', "messages[0].content"),
        ('[{"role": "user", "content": [{"type": "text"}]}]', "messages[0].content[0].text"),
        ('[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]',
         "messages[0].content[0].type"),
    ],
)  # fmt: skip
def test_chat_messages_the_template_cannot_render_are_400s(messages, param):
    with pytest.raises(APIError) as e:
        parse_body(ChatCompletionRequest, f'{{"messages": {messages}}}'.encode())
    assert e.value.status == 400 and e.value.type == "invalid_request_error"
    assert e.value.param == param, e.value.message
    assert param in e.value.message


def test_chat_roles_and_text_parts():
    body = {
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": "hi", "name": "ann"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": [{"type": "text", "text": "more"}]},
        ]
    }
    req = parse_body(ChatCompletionRequest, json.dumps(body).encode())
    assert req.template_messages() == [
        {"role": "system", "content": "be brief"},  # developer is OpenAI's newer name for system
        {"role": "system", "content": "ab"},
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "more"},
    ]
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    with pytest.raises(APIError, match="only text parts are supported"):
        parse_body(ChatCompletionRequest, json.dumps(image).encode())


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 4, "max_completion_tokens": -3}, "max_completion_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"max_tokens": 0, "max_completion_tokens": 4}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_both_completion_limits_are_checked_and_named(fields, param):
    body = {"messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(APIError) as e:
        parse_body(ChatCompletionRequest, json.dumps(body).encode())
    assert e.value.status == 400 and e.value.param == param
    assert e.value.message.startswith(f"{param} must be in [1, 2147483647], got ")


def test_max_completion_tokens_wins_and_is_named_when_too_long():
    handler = GenerationHandler(_frontend_args(), CODEC)

    def limit(fields: dict) -> tuple[int, str | None]:
        req = parse_body(
            ChatCompletionRequest,
            json.dumps({"messages": [{"role": "user", "content": "hi"}], **fields}).encode(),
        )
        try:
            return handler._sampling(req, prompt_len=10, chat=True, max_len=100).max_tokens, None
        except APIError as e:
            assert e.code == "context_length_exceeded"
            return -1, e.param

    assert limit({"max_tokens": 4, "max_completion_tokens": 7}) == (7, None)
    assert limit({"max_tokens": 4}) == (4, None)
    assert limit({}) == (90, None)  # chat: the rest of the context
    assert limit({"max_tokens": 4, "max_completion_tokens": 91}) == (-1, "max_completion_tokens")
    assert limit({"max_tokens": 91, "max_completion_tokens": 4}) == (4, None)
    assert limit({"max_tokens": 91}) == (-1, "max_tokens")
    req = parse_body(
        CompletionRequest, b'{"prompt": "x", "max_completion_tokens": 3}'
    )  # not a completions field
    assert handler._sampling(req, prompt_len=10, chat=False, max_len=100).max_tokens == 16


def _frontend_args(**kw) -> FrontendArgs:
    ends = {"frontend": "ipc://f", "launcher": "ipc://l", "subservers": {"slm": "ipc://s"}}
    return FrontendArgs(policy="p", entry="slm", models=["slm"], model_dir=str(MODELS / "tiny-small"),
                        endpoints=ends, **kw)  # fmt: skip


def _request(chunks: list[bytes], content_length: int | None = None) -> tuple[Request, list[dict]]:
    """A Starlette request whose body arrives in `chunks`; the list holds the messages not received yet."""
    pending = [
        {"type": "http.request", "body": c, "more_body": i + 1 < len(chunks)} for i, c in enumerate(chunks)
    ]
    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]

    async def receive() -> dict:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive), pending


def test_request_body_limit():
    limit = 1000
    assert _frontend_args().max_body_bytes == MAX_BODY_BYTES == 16 << 20
    with pytest.raises(ValueError, match="max_body_bytes"):
        _frontend_args(max_body_bytes=10)

    req, _ = _request([b"a" * 600, b"b" * 400], content_length=1000)
    assert asyncio.run(read_json_body(req, limit, 5.0)) == b"a" * 600 + b"b" * 400  # exactly the limit
    # told by Content-Length: refused before any of the body is read
    req, pending = _request([b"a" * 600, b"b" * 401], content_length=1001)
    with pytest.raises(APIError) as e:
        asyncio.run(read_json_body(req, limit, 5.0))
    assert (e.value.status, e.value.code, e.value.type) == (413, "request_too_large", "invalid_request_error")
    assert len(pending) == 2
    # chunked (no Content-Length): refused at the chunk that crosses the limit, the rest left unread
    req, pending = _request([b"a" * 600, b"b" * 401, b"c" * 5000])
    with pytest.raises(APIError) as e:
        asyncio.run(read_json_body(req, limit, 5.0))
    assert e.value.status == 413 and str(limit) in e.value.message and len(pending) == 1


def test_a_body_that_stalls_gets_408_and_a_client_gone_mid_body_a_disconnect(caplog):
    async def stalled() -> dict:
        await asyncio.sleep(3600)
        return {}

    req = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, stalled)
    t0 = time.monotonic()
    with pytest.raises(APIError) as e:
        asyncio.run(read_json_body(req, 1000, 0.2))
    assert (e.value.status, e.value.code) == (408, "request_timeout") and "0.2 s" in e.value.message
    assert time.monotonic() - t0 < 2.0
    req, pending = _request([b"a" * 10, b"b" * 10])
    pending.pop()  # the client goes away after the first chunk
    with caplog.at_level(logging.INFO, logger="tokenrouter.frontend"), pytest.raises(APIError) as e:
        asyncio.run(read_json_body(req, 1000, 5.0))
    assert e.value.status == 499 and "disconnected while sending the body" in caplog.text
    assert not any(r.exc_info for r in caplog.records)


@pytest.mark.parametrize(
    ("content_type", "ok"),
    [
        (None, True),
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/vnd.api+json", True),
        ("text/plain", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
    ],
)
def test_only_json_bodies_are_accepted(content_type, ok):
    if ok:
        check_json_type(content_type)
        return
    with pytest.raises(APIError) as e:
        check_json_type(content_type)
    assert e.value.status == 415 and "application/json" in e.value.message


def test_encode_many_is_the_tokenizers_encode():
    texts = ["def add(a, b):", "naïve 😀 text", "", "  x\n\ty  ", "<|im_start|>user"]
    for special in (True, False):
        want = [CODEC.tokenizer.encode(t, add_special_tokens=special).ids for t in texts]
        assert CODEC.encode_many(texts, special) == want
        assert [CODEC.encode(t, special) for t in texts] == want


def test_chat_template_from_the_model_folder():
    text = CODEC.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = CODEC.encode_chat([{"role": "user", "content": "hi"}])
    assert ids[0] == CODEC.tokenizer.token_to_id("<|im_start|>")


def test_template_errors_are_user_errors(tmp_path):
    (tmp_path / "tokenizer.json").write_text((MODELS / "tiny-small" / "tokenizer.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(
        "{\"chat_template\": \"{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok\"}"
    )
    codec = TextCodec(tmp_path)
    with pytest.raises(TemplateError, match="first must be user"):
        codec.apply_chat_template([{"role": "assistant", "content": "x"}])
    with pytest.raises(FileNotFoundError):
        TextCodec(tmp_path / "nope")


def test_metrics_render_prometheus_text():
    mt = Metrics(models=["slm", "llm"])
    mt.tokens["slm"] += 5
    mt.hops[("slm", "llm")] += 2
    mt.on_stats(
        m.SubserverStats(
            "slm",
            queue=m.QueueStats(1, 2, 3),
            kv=m.KvStats(pages_total=100, pages_free=90),
            step=m.StepStats(count=10, last_batch_size=4, last_ms=12.5),
        )
    )
    text = mt.render(active=2)
    assert "tokenrouter_requests_active 2\n" in text
    assert 'tokenrouter_generation_tokens_total{model="slm"} 5\n' in text
    assert 'tokenrouter_generation_tokens_total{model="llm"} 0\n' in text
    assert 'tokenrouter_hops_total{from="slm",to="llm"} 2\n' in text
    assert 'tokenrouter_step_latency_seconds{model="slm"} 0.0125\n' in text
    assert 'tokenrouter_kv_pages_free{model="slm"} 90\n' in text
    mt.ttft.observe(0.02)
    mt.ttft.observe(100.0)
    text = mt.render(active=2)
    assert 'tokenrouter_time_to_first_token_seconds_bucket{le="0.01"} 0\n' in text
    assert 'tokenrouter_time_to_first_token_seconds_bucket{le="0.025"} 1\n' in text
    assert 'tokenrouter_time_to_first_token_seconds_bucket{le="+Inf"} 2\n' in text
    assert "tokenrouter_time_to_first_token_seconds_count 2\n" in text
    assert "tokenrouter_e2e_request_latency_seconds_count 0\n" in text
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or line.startswith("tokenrouter_")


def test_a_token_that_never_arrives_fails_the_request(monkeypatch):
    import tokenrouter.runtime.frontend.generation as gen

    monkeypatch.setattr(gen, "GAP_TIMEOUT_S", 0.05)

    async def go():
        st = ReqState(rid="r", prompt_len=1)
        mgr = _Aborts()
        c = Choice(mgr, CODEC, st, 0, [], ["slm", "llm"])
        st.add(m.TokenOut(rid="r", index=0, token_ids=[300], model="slm", hop_to="llm"))
        st.add(m.TokenOut(rid="r", index=2, token_ids=[301], model="slm"))  # index 1 is lost
        st.finish_reason = "length"
        st.event.set()
        with pytest.raises(APIError, match="token 1 missing"):
            async for _ in c.deltas():
                pass
        return mgr.aborted

    assert asyncio.run(go()) == [("r", "abort")]


def test_detokenizer_pieces_add_up_to_the_full_decode():
    ids = CODEC.encode("naïve 😀 text", add_special_tokens=False)
    end = CODEC.tokenizer.token_to_id("<|im_end|>")
    # every prefix: some end inside a multi-byte character (decode gives U+FFFD there)
    for seq in [ids[:k] for k in range(1, len(ids) + 1)] + [[*ids, end]]:
        d = CODEC.decoder()
        text = "".join(d.step(t) for t in seq) + d.flush()
        assert text == CODEC.tokenizer.decode(seq, skip_special_tokens=True)
        assert d.flush() == ""


def test_the_active_count_is_numbered(tmp_path):
    """Every change of n gets a higher `count_seq`; a NewRequest carries the count it made and each
    coalesced ActiveCount the latest, so subservers can tell an older count (a hop's) from a newer one."""
    from tokenrouter.runtime.frontend.request_manager import RequestManager

    async def go():
        ends = {"frontend": f"ipc://{tmp_path}/f", "subservers": {x: f"ipc://{tmp_path}/{x}" for x in "ab"}}
        mgr = RequestManager(ends, ["a", "b"], "a")
        sent = []
        decode = msgspec.msgpack.Decoder(m.ToSubserver).decode
        mgr._send_bytes = lambda name, data, what: sent.append((name, decode(data))) or True
        mgr.ready_models = {"a": {}, "b": {}}
        spec = m.SamplingSpec(max_tokens=4)
        first = mgr.submit([1, 2], spec)
        mgr.submit([3], spec)
        await asyncio.sleep(0)  # the loop turn ends: one ActiveCount for both arrivals
        mgr.abort(first.rid)
        await asyncio.sleep(0)
        await mgr.close()
        return sent

    before = time.time_ns() // 1000
    sent = asyncio.run(go())
    news = [msg for _, msg in sent if isinstance(msg, m.NewRequest)]
    counts = [(name, msg) for name, msg in sent if isinstance(msg, m.ActiveCount)]
    # numbered from the wall clock (µs), so that a restarted frontend numbers above the one before it
    base = news[0].count_seq - 1
    assert base >= before
    assert [(x.n_active, x.count_seq - base) for x in news] == [(1, 1), (2, 2)]
    assert [(name, x.n_active, x.count_seq - base) for name, x in counts] == [
        ("a", 2, 2), ("b", 2, 2), ("a", 1, 3), ("b", 1, 3)
    ]  # fmt: skip


def test_a_request_that_cannot_be_sent_is_never_registered(tmp_path):
    """A value no message can carry (beyond 64 bits) is a 400, and the request leaves no trace in the active
    table; a full queue is a 503, also without a trace."""
    import zmq

    from tokenrouter.runtime.frontend.request_manager import RequestManager

    async def go():
        ends = {"frontend": f"ipc://{tmp_path}/f", "subservers": {x: f"ipc://{tmp_path}/{x}" for x in "ab"}}
        mgr = RequestManager(ends, ["a", "b"], "a")
        mgr.ready_models = {"a": {}, "b": {}}
        statuses = []
        for spec in (m.SamplingSpec(top_k=2**64), m.SamplingSpec(stop_token_ids=(2**70,))):
            with pytest.raises(APIError) as e:
                mgr.submit([1, 2], spec)
            statuses.append(e.value.status)

        def full(*args):
            raise zmq.Again()

        mgr._push["a"].send = full
        with pytest.raises(APIError) as e:
            mgr.submit([1, 2], m.SamplingSpec())
        statuses.append(e.value.status)
        await asyncio.sleep(0)
        n = (mgr.n_active, dict(mgr.requests))
        await mgr.close()
        return statuses, n

    statuses, n = asyncio.run(go())
    assert statuses == [400, 400, 503] and n == (0, {})


def test_a_profile_whose_subserver_fails_or_does_not_answer(tmp_path):
    """`RequestManager.profile`: a subserver's failed start is a 500 naming it, and the others' profiles are
    discarded (a stop with no folder) so a start can be tried again; a subserver that does not answer is a 504
    naming it."""
    from tokenrouter.runtime.frontend.protocol import APIError
    from tokenrouter.runtime.frontend.request_manager import RequestManager

    async def go():
        ends = {"frontend": f"ipc://{tmp_path}/f", "subservers": {x: f"ipc://{tmp_path}/{x}" for x in "ab"}}
        mgr = RequestManager(ends, ["a", "b"], "a")
        sent, answers = [], {}

        def send(name, msg):
            sent.append((name, msg))
            if (reply := answers.get((name, msg.start))) is not None:
                asyncio.get_running_loop().call_soon(mgr._on_profile_done, reply)
            return True

        mgr._send = send
        answers[("a", True)] = m.ProfileDone(model="a", start=True)
        answers[("b", True)] = m.ProfileDone(model="b", start=True, error="RuntimeError: CUPTI")
        with pytest.raises(APIError) as failed:
            await mgr.profile(True, "/x", 5.0)
        assert (failed.value.status, failed.value.code) == (500, "profile_failed")
        assert "the profiler failed in 'b': RuntimeError: CUPTI" in failed.value.message
        assert not mgr.profiling and sent[-1] == ("a", m.Profile(model="a", start=False))  # discarded
        answers[("b", True)] = None  # b does not answer
        with pytest.raises(APIError) as late:
            await mgr.profile(True, "/x", 0.05)
        assert (late.value.status, late.value.code) == (504, "profile_timeout")
        assert late.value.message == "subserver(s) 'b' did not answer within 0.05 s"
        assert mgr.profiling and not mgr._profile_replies  # a's did start: a stop is allowed
        await mgr.close()

    asyncio.run(go())


TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.mark.parametrize(
    "template, jinja_files",
    [
        (TEMPLATE, True),  # chat_template.jinja, as transformers 5 saves it
        (TEMPLATE, False),  # a string in tokenizer_config.json
        (
            {"default": TEMPLATE, "tool_use": "tools: {{ messages | length }}"},
            True,
        ),  # + additional_chat_templates/
        ({"default": TEMPLATE, "tool_use": "tools: {{ messages | length }}"}, False),  # a list of named ones
    ],
)
def test_chat_template_where_transformers_saves_it(tmp_path, template, jinja_files):
    """The folder's chat template renders as `transformers.AutoTokenizer.apply_chat_template` renders it, in
    each form `save_pretrained` writes."""
    transformers = pytest.importorskip("transformers")
    from tokenrouter.runtime.engine.generate import apply_chat_template

    tok = transformers.AutoTokenizer.from_pretrained(str(MODELS / "tiny-small"))
    tok.chat_template = template
    tok.save_pretrained(str(tmp_path), save_jinja_files=jinja_files)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (tmp_path / "chat_template.jinja").is_file() == jinja_files
    assert ("chat_template" in config) != jinja_files
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    want = transformers.AutoTokenizer.from_pretrained(str(tmp_path)).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert want.startswith("[user] hi<|im_end|>\n")
    assert TextCodec(tmp_path).apply_chat_template(messages) == want
    assert apply_chat_template(tmp_path, messages) == want  # `generate --chat`


def test_a_folder_without_a_chat_template_says_where_it_looked(tmp_path):
    (tmp_path / "tokenizer.json").write_text((MODELS / "tiny-small" / "tokenizer.json").read_text())
    with pytest.raises(
        TemplateError, match="neither chat_template.jinja nor a chat_template in tokenizer_config"
    ):
        TextCodec(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(TemplateError, match="the chat template does not parse"):
        TextCodec(tmp_path)
