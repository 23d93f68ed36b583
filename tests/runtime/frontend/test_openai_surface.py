"""The OpenAI surface beyond one plain choice, with the `openai` client against a real `tokenrouter serve`
(tiny models, CPU): `n` choices, `chat_template_kwargs`, stop strings across a hop, and tools refused where
the chat template does not render them. The entry model is a copy of tiny-small whose chat template reads Qwen3's `enable_thinking`."""

from __future__ import annotations

import shutil
import signal

import openai
import pytest
from frontend_helpers import MODELS, Server, write_policy

from tokenrouter.runtime.frontend.codec import TextCodec

THINKING_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)
EXTRA = {"ignore_eos": True, "return_routing_trace": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "thinking-small"
    shutil.copytree(MODELS / "tiny-small", folder)
    (folder / "chat_template.jinja").write_text(THINKING_TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory, small):
    tmp = tmp_path_factory.mktemp("surface")
    srv = Server(write_policy(tmp, small=small), log_dir=tmp)
    yield srv
    assert srv.stop(signal.SIGINT) == 0, srv.stderr()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def _same(a, b) -> None:
    assert a.text == b.text
    assert a.model_extra["routing"] == b.model_extra["routing"]


def test_n_choices_equal_separate_requests_seeded_seed_plus_i(client):
    kw = dict(model="testmix", max_tokens=8, temperature=1.0, extra_body=EXTRA)
    many = client.completions.create(prompt=["def f(x):", "import os\n"], n=3, seed=41, **kw)
    assert [c.index for c in many.choices] == list(range(6))
    for c in many.choices:
        prompt, i = ["def f(x):", "import os\n"][c.index // 3], c.index % 3
        _same(c, client.completions.create(prompt=prompt, seed=41 + i, **kw).choices[0])
    assert len({c.text for c in many.choices[:3]}) > 1  # the seeds differ, so do the samples
    assert many.usage.completion_tokens == 6 * 8


def test_n_counts_each_prompt_once_and_streams(client):
    kw = dict(model="testmix", prompt="class A:", max_tokens=5, temperature=1.0, seed=3, extra_body=EXTRA)
    one = client.completions.create(**kw)
    three = client.completions.create(n=3, **kw)
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    texts = {0: "", 1: "", 2: ""}
    for chunk in client.completions.create(n=3, stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == {c.index: c.text for c in three.choices}


def test_chat_n(client):
    kw = dict(model="testmix", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=1.0)
    two = client.chat.completions.create(n=2, seed=9, extra_body=EXTRA, **kw)
    for c in two.choices:
        alone = client.chat.completions.create(seed=9 + c.index, extra_body=EXTRA, **kw).choices[0]
        assert c.message.content == alone.message.content
        assert c.model_extra["routing"] == alone.model_extra["routing"]


def test_chat_template_kwargs_reach_the_template(client, small):
    codec = TextCodec(small)
    messages = [{"role": "user", "content": "hello"}]
    for kwargs in (None, {"enable_thinking": False}, {"enable_thinking": True}):
        r = client.chat.completions.create(
            model="testmix",
            messages=messages,
            max_tokens=2,
            temperature=0,
            extra_body={"chat_template_kwargs": kwargs} if kwargs else {},
        )
        assert r.usage.prompt_tokens == len(codec.encode_chat(messages, **(kwargs or {})))
    assert len(codec.encode_chat(messages, enable_thinking=False)) > len(codec.encode_chat(messages))
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="testmix", messages=messages, extra_body={"chat_template_kwargs": {"messages": []}}
        )
    assert e.value.body["param"] == "chat_template_kwargs"


def test_a_stop_string_spanning_a_hop(client, small):
    codec = TextCodec(small)
    kw = dict(model="testmix", prompt="for i in range(10):", max_tokens=24, temperature=0, extra_body=EXTRA)
    for seed in range(20):
        full = client.completions.create(seed=seed, **kw).choices[0]
        trace, ids = full.model_extra["routing"]["trace"], full.model_extra["routing"]["token_ids"]
        for k in range(1, len(ids)):
            before = codec.tokenizer.decode(ids[:k], skip_special_tokens=True)
            after = codec.tokenizer.decode(ids[: k + 1], skip_special_tokens=True)
            if trace[k] == trace[k - 1] or not before or len(after) <= len(before):
                continue
            stop = (
                before[-1] + after[len(before)]
            )  # last character of one model's token, first of the other's
            if full.text.find(stop) != len(before) - 1:
                continue
            cut = client.completions.create(seed=seed, stop=[stop], **kw).choices[0]
            assert cut.finish_reason == "stop"
            assert cut.text == full.text[: len(before) - 1]
            return
    pytest.fail("no hop with a fresh two-character string found")


def test_tools_need_a_template_that_renders_them(client):
    """The entry model's template here reads no `tools` (test_structured_output.py serves one that does)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    answered = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]  # fmt: skip
    for extra in ({"tools": [tool]}, {"messages": [{"role": "user", "content": "hi"}, *answered]}):
        body = {"messages": [{"role": "user", "content": "hi"}], **extra}
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="testmix", max_tokens=2, **body)
        assert e.value.body["param"] == "tools" and "does not render tools" in e.value.body["message"]


@pytest.fixture(scope="module")
def reference(server):
    """The plan's models run in-process, sequence by sequence (no batching, no KV cache)."""
    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.runtime.reference import ReferenceModel
    from tokenrouter.runtime.subserver.loading import load_model_runtime

    plan = compile_file(server.plan, {}).plan
    return {x: ReferenceModel.from_engine(load_model_runtime(plan, x, "cpu")[0]) for x in plan["models"]}


def _ref_logprobs(reference, prompt: list[int], ids: list[int], trace: list[str], k: int):
    import torch

    out = []
    for i, (tok, model) in enumerate(zip(ids, trace, strict=True)):
        logits, _ = reference[model].forward_full(torch.tensor(prompt + ids[:i], dtype=torch.int64))
        lp = torch.log_softmax(logits[-1].float(), dim=-1)
        top = lp.topk(k)
        out.append((lp[tok].item(), top.indices.tolist(), top.values.tolist()))
    return out


def test_completion_logprobs_are_the_writing_models_log_softmax(client, reference, small):
    codec = TextCodec(small)
    prompt = codec.encode("def add(a, b):")
    r = client.completions.create(
        model="testmix", prompt=prompt, max_tokens=12, temperature=0.8, seed=11, logprobs=3, extra_body=EXTRA
    ).choices[0]
    routing = r.model_extra["routing"]
    assert {"slm", "llm"} <= set(routing["trace"])  # both models wrote, so both models' values are checked
    ref = _ref_logprobs(reference, prompt, routing["token_ids"], routing["trace"], 3)
    lp = r.logprobs
    assert len(lp.token_logprobs) == len(ref) == 12
    for i, (want, top_ids, top_vals) in enumerate(ref):
        assert lp.token_logprobs[i] == pytest.approx(want, abs=1e-4), i
        text = [codec.tokenizer.decode([t], skip_special_tokens=False) for t in top_ids]
        # as OpenAI's shape has it, a dict by token text (two ids of the same text keep the later one)
        assert lp.top_logprobs[i] == pytest.approx(dict(zip(text, top_vals, strict=True)), abs=1e-4), i
    assert lp.tokens == [codec.tokenizer.decode([t], skip_special_tokens=False) for t in routing["token_ids"]]
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs_streamed_and_whole_agree(client, reference, small):
    messages = [{"role": "user", "content": "hello"}]
    kw = dict(model="testmix", messages=messages, max_tokens=8, temperature=1.0, seed=4, logprobs=True)
    whole = client.chat.completions.create(top_logprobs=2, extra_body=EXTRA, **kw).choices[0]
    content = whole.logprobs.content
    routing = whole.model_extra["routing"]
    prompt = TextCodec(small).encode_chat(messages)
    ref = _ref_logprobs(reference, prompt, routing["token_ids"], routing["trace"], 2)
    assert [c.logprob for c in content] == pytest.approx([x[0] for x in ref], abs=1e-4)
    assert all(len(c.top_logprobs) == 2 and bytes(c.bytes).decode() == c.token for c in content)
    streamed = []
    for chunk in client.chat.completions.create(top_logprobs=2, stream=True, extra_body=EXTRA, **kw):
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.content:
                streamed += c.logprobs.content
    # the same tokens; the values to float noise (the two requests run in steps of other compositions)
    assert [c.token for c in streamed] == [c.token for c in content]
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content], abs=1e-4)
    plain = client.chat.completions.create(**{**kw, "logprobs": False}).choices[0]
    assert plain.logprobs is None and plain.message.content == whole.message.content
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="testmix", messages=messages, top_logprobs=2)
    assert e.value.body["param"] == "top_logprobs"


def _prompt_reference(reference, prompt: list[int], k: int) -> list:
    """The entry model's log-softmax at each prompt position: (logprob of the next prompt token, top ids, values)."""
    import torch

    logits, _ = reference["slm"].forward_full(torch.tensor(prompt, dtype=torch.int64))
    lp = torch.log_softmax(logits.float(), dim=-1)
    top = lp.topk(k, dim=-1)
    return [(lp[i, prompt[i + 1]].item(), top.indices[i].tolist(), top.values[i].tolist())
            for i in range(len(prompt) - 1)]  # fmt: skip


def test_echo_scores_the_prompt_on_the_entry_model(client, reference, small):
    codec = TextCodec(small)
    text = "def add(a, b):\n    return"
    prompt = codec.encode(text)
    kw = dict(model="testmix", max_tokens=6, temperature=0.8, seed=5, logprobs=3, extra_body=EXTRA)
    for _ in range(
        2
    ):  # the second time the prompt's blocks are in the prefix cache: every position still scored
        r = client.completions.create(prompt=text, echo=True, **kw).choices[0]
        routing = r.model_extra["routing"]
        assert routing["prompt_logprobs_from"] == "slm"
        lp = r.logprobs
        n = len(prompt)
        assert r.text.startswith(text) and len(lp.tokens) == n + 6
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        ref = _prompt_reference(reference, prompt, 3)
        for i, (want, top_ids, top_vals) in enumerate(ref, start=1):
            assert lp.token_logprobs[i] == pytest.approx(want, abs=1e-4), i
            names = [codec.tokenizer.decode([t], skip_special_tokens=False) for t in top_ids]
            assert lp.top_logprobs[i] == pytest.approx(dict(zip(names, top_vals, strict=True)), abs=1e-4), i
        # the completion's part is what the request without echo returns, its offsets after the prompt's text
        plain = client.completions.create(prompt=text, **kw).choices[0]
        assert r.text == text + plain.text
        assert lp.token_logprobs[n:] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-6)
        assert lp.text_offset[n] == len(text) and lp.text_offset[:n] == sorted(lp.text_offset[:n])


def test_echo_scores_only_with_max_tokens_zero_and_token_id_prompts(client, reference, small):
    codec = TextCodec(small)
    prompts = [codec.encode("import numpy as np"), codec.encode("x = 1\ny = 2")]
    r = client.completions.create(model="testmix", prompt=prompts, max_tokens=0, echo=True, logprobs=1)
    assert r.usage.completion_tokens == 0 and len(r.choices) == 2
    for c, ids in zip(r.choices, prompts, strict=True):
        assert c.text == codec.tokenizer.decode(ids, skip_special_tokens=False)
        assert c.finish_reason == "length" and len(c.logprobs.tokens) == len(ids)
        ref = _prompt_reference(reference, ids, 1)
        assert c.logprobs.token_logprobs[1:] == pytest.approx([x[0] for x in ref], abs=1e-4)
        # lm-eval's greedy check: a continuation token is greedy when its logprob is the top one
        assert all(max(top.values()) >= v - 1e-6 for top, v in zip(c.logprobs.top_logprobs[1:],
                                                                      c.logprobs.token_logprobs[1:], strict=True))  # fmt: skip
    echoed = client.completions.create(model="testmix", prompt="hello world", max_tokens=0, echo=True)
    assert echoed.choices[0].text == "hello world" and echoed.choices[0].logprobs is None


def test_echo_streams_the_prompt_first(client, small):
    """`echo` with `stream`: each choice's first chunk is its prompt (with the prompt's logprobs), then the
    completion's chunks; joined they are the unstreamed answer, offsets and all."""
    text = "def add(a, b):\n    return"
    kw = dict(model="testmix", prompt=text, max_tokens=5, temperature=0.8, seed=7, logprobs=2, echo=True, n=2)
    whole = client.completions.create(**kw)
    texts, lps, first = {}, {}, {}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            first.setdefault(c.index, c.text)
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.logprobs is not None:
                for key in ("tokens", "token_logprobs", "text_offset"):
                    lps.setdefault(c.index, {}).setdefault(key, []).extend(getattr(c.logprobs, key))
    n = len(TextCodec(small).encode(text))
    for c in whole.choices:
        assert first[c.index] == text and texts[c.index] == c.text
        assert lps[c.index]["tokens"] == c.logprobs.tokens and len(c.logprobs.tokens) == n + 5
        assert lps[c.index]["text_offset"] == c.logprobs.text_offset
        assert lps[c.index]["token_logprobs"][0] is None
        assert lps[c.index]["token_logprobs"][1:] == pytest.approx(c.logprobs.token_logprobs[1:], abs=1e-4)
    scored = list(client.completions.create(stream=True, **{**kw, "max_tokens": 0, "n": 1}))
    assert "".join(c.text for ch in scored for c in ch.choices) == text
    assert scored[-1].choices[0].finish_reason == "length"


def _prefix_counters(server, model: str, arrivals: float = 0.0) -> tuple[float, float]:
    """(arrivals, matched tokens) of `model`'s prefix cache from /metrics, once at least `arrivals` are counted
    (the subservers' stats reach the frontend a moment after their steps)."""
    import time

    import httpx

    deadline = time.monotonic() + 20
    while True:
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        got = {}
        for name in ("arrivals", "matched_tokens"):
            key = f'tokenrouter_prefix_{name}{{model="{model}"}}'
            got[name] = float(next(x for x in text.splitlines() if x.startswith(key)).split()[-1])
        if got["arrivals"] >= arrivals or time.monotonic() > deadline:
            return got["arrivals"], got["matched_tokens"]
        time.sleep(0.1)


def test_n_echoed_choices_score_their_prompt_once(client, server):
    """n choices of one echoed prompt: the first scores it, the others echo its scores and start from the prefix
    cache (a scoring request cannot: it needs every position's logits)."""
    text = "def scale(values, factor):\n    out = []\n    for v in values:\n        out.append(v * factor)\n"
    arrivals, _ = _prefix_counters(server, "slm")
    client.completions.create(model="testmix", prompt=text, max_tokens=1)  # the prompt's blocks cached
    arrivals, before = _prefix_counters(server, "slm", arrivals + 1)
    r = client.completions.create(
        model="testmix", prompt=text, max_tokens=2, echo=True, logprobs=1, n=3, seed=3
    )
    matched = _prefix_counters(server, "slm", arrivals + 3)[1] - before
    assert matched >= 2 * 16, matched  # choices 1 and 2 matched the cached prompt; choice 0 scored it
    n = len(r.choices[0].logprobs.tokens) - 2
    first = r.choices[0].logprobs
    for c in r.choices:
        assert c.text.startswith(text) and c.logprobs.tokens[:n] == first.tokens[:n]
        assert (
            c.logprobs.token_logprobs[1:n] == first.token_logprobs[1:n]
            and c.logprobs.token_logprobs[0] is None
        )


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        (dict(echo=True, logprobs=21), "logprobs"),
        (dict(max_tokens=0), "max_tokens"),
    ],
)
def test_echo_refusals(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="testmix", prompt="hi", **{"max_tokens": 2, **kw})
    assert e.value.body["param"] == param


def test_chat_has_no_echo(client):
    with pytest.raises(openai.BadRequestError, match="completions only") as e:
        client.chat.completions.create(model="testmix", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"echo": True})  # fmt: skip
    assert e.value.body["param"] == "echo"
