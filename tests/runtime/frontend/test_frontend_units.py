"""Frontend pieces without processes: token reordering, stop strings, request validation, chat template."""

from __future__ import annotations

import asyncio
import time

import pytest
from frontend_helpers import MODELS

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.frontend.codec import TemplateError, TextCodec
from tokenrouter.runtime.frontend.generation import Choice
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


def _run_choice(text: str, stop: list[str], chunk: int = 1) -> tuple[list[str], Choice, _Aborts]:
    ids = CODEC.encode(text, add_special_tokens=False)

    async def go():
        st = ReqState(rid="r", prompt_len=1)
        mgr = _Aborts()
        c = Choice(mgr, CODEC, st, 0, stop, ["slm", "llm"], want_trace=True)
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
        (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "messages.0.content"),
    ]:
        model = ChatCompletionRequest if b"messages" in body else CompletionRequest
        with pytest.raises(APIError) as e:
            parse_body(model, body)
        assert e.value.status == 400 and (e.value.param or "").startswith(param), (body, e.value.param)
    chat = parse_body(
        ChatCompletionRequest,
        b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4}',
    )
    assert chat.max_tokens == 4


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
    mt.on_stats(m.SubserverStats("slm", 1, 2, 3, 4, 12.5, 10, 100, 90))
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
        mgr._send = lambda name, msg: sent.append((name, msg)) or True
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
