"""Structured output and tools with the `openai` client against a real `tokenrouter serve` (tiny models, CPU,
both writing): `response_format` JSON always parses and validates whichever model wrote its tokens, a required
or named tool call comes back as `tool_calls` (whole and streamed), and bad input is a 400. The entry model is a
copy of tiny-small whose chat template renders tools as Qwen's does (or, for the Llama 3 JSON syntax, as
Llama 3.1's does)."""

from __future__ import annotations

import json
import shutil
import signal

import jsonschema
import openai
import pytest
from frontend_helpers import MODELS, Server, write_policy

TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}"
    "{{- '\\n' + (tool | tojson) }}{%- endfor %}{{- '\\n</tools>\\nFor each function call, return a json object "
    'with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}{%- endif %}'
    "{%- for message in messages %}{%- if message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message.tool_calls %}{{- '<|im_start|>assistant' }}{%- for call in message.tool_calls %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' '
    "+ (call.function.arguments | tojson) + '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# the custom-tool part of Llama 3.1's template: tools in the system turn, a call as the assistant's whole turn
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- if tools is not defined %}{%- set tools = none %}{%- endif %}"
    "{%- if tools is not none %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n"
    "Environment: ipython\\nYou have access to the following functions. To call a function, please respond with "
    'JSON for a function call.Respond in the format {\\"name\\": function name, \\"parameters\\": dictionary of '
    "argument name and its value}.Do not use variables.\\n\\n' }}{%- for t in tools %}{{- t | tojson(indent=4) }}"
    "{{- '\\n\\n' }}{%- endfor %}{{- '<|eot_id|>' }}{%- endif %}{%- for message in messages %}"
    "{%- if 'tool_calls' in message %}{%- set tool_call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}{{- tool_call.arguments | tojson }}"
    "{{- '}' }}{{- '<|eot_id|>' }}{%- elif message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
# Mistral 7B v0.3's template, in short: the tools before the last user message, calls as a JSON list after
# [TOOL_CALLS], each with the 9-character id the template insists on
MISTRAL_TEMPLATE = (
    "{{- bos_token }}{%- if tools is not defined %}{%- set tools = none %}{%- endif %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}"
    "{%- if tools is not none and loop.last %}{{- '[AVAILABLE_TOOLS] ' + tools|tojson + '[/AVAILABLE_TOOLS]' }}"
    "{%- endif %}{{- '[INST] ' + message.content + '[/INST]' }}"
    "{%- elif message.tool_calls is defined and message.tool_calls is not none %}{{- '[TOOL_CALLS] [' }}"
    "{%- for tool_call in message.tool_calls %}{%- set out = tool_call.function|tojson %}{{- out[:-1] }}"
    "{%- if not tool_call.id is defined or tool_call.id|length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    "{{- ', \"id\": \"' + tool_call.id + '\"}' }}{%- if not loop.last %}{{- ', ' }}{%- else %}"
    "{{- ']' + eos_token }}{%- endif %}{%- endfor %}"
    "{%- elif message.role == 'tool' %}{{- '[TOOL_RESULTS] {\"content\": ' + message.content|tojson + ', \"call_id\": \"'"
    " + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}"
    "{%- elif message.role == 'assistant' %}{{- ' ' + message.content + eos_token }}{%- endif %}{%- endfor %}"
)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "tag": {"enum": ["a", "b", "c"]},
    },
    "required": ["name", "ok", "n", "tag"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TRACE = {"return_routing_trace": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("structured")
    small = tmp / "tools-small"
    shutil.copytree(MODELS / "tiny-small", small)
    (small / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    srv = Server(write_policy(tmp, small=small), log_dir=tmp)
    yield srv
    assert srv.stop(signal.SIGINT) == 0, srv.stderr()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def _template_server(tmp_path_factory, name: str, template: str):
    """A server whose entry model (the tiny small one) has `template` as its chat template; yields a client."""
    tmp = tmp_path_factory.mktemp(f"structured-{name}")
    small = tmp / f"{name}-small"
    shutil.copytree(MODELS / "tiny-small", small)
    (small / "chat_template.jinja").write_text(template)
    srv = Server(write_policy(tmp, small=small), log_dir=tmp)
    yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=60)
    assert srv.stop(signal.SIGINT) == 0, srv.stderr()


@pytest.fixture(scope="module")
def llama_client(tmp_path_factory):
    """A server whose entry model's template teaches Llama 3's JSON tool calls."""
    yield from _template_server(tmp_path_factory, "llama", LLAMA3_TEMPLATE)


@pytest.fixture(scope="module")
def mistral_client(tmp_path_factory):
    """A server whose entry model's template teaches Mistral's `[TOOL_CALLS]` list."""
    yield from _template_server(tmp_path_factory, "mistral", MISTRAL_TEMPLATE)


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}}


def test_json_schema_output_parses_and_validates_across_hops(client):
    models = set()
    for seed in range(6):
        r = client.chat.completions.create(model="testmix", messages=USER, max_tokens=120, seed=seed,
                                           temperature=(0.0, 1.0)[seed % 2], response_format=_schema_format(SCHEMA),
                                           extra_body=TRACE)  # fmt: skip
        c = r.choices[0]
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), SCHEMA)
        models |= set(c.model_extra["routing"]["trace"])
        assert c.model_extra["routing"]["hops"] > 0
    assert models == {"slm", "llm"}  # both models wrote tokens of the JSON


def test_json_object_streamed_and_on_completions(client):
    text = ""
    for chunk in client.chat.completions.create(model="testmix", messages=USER, max_tokens=200, seed=3,
                                                temperature=0, response_format={"type": "json_object"},
                                                stream=True):  # fmt: skip
        text += chunk.choices[0].delta.content or "" if chunk.choices else ""
    assert text.startswith("{")
    r = client.completions.create(model="testmix", prompt="x = ", max_tokens=120, seed=1, temperature=0,
                                  extra_body={"response_format": _schema_format(SCHEMA)})  # fmt: skip
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_call(client, choice):
    r = client.chat.completions.create(model="testmix", messages=USER, tools=[TIME, WEATHER], tool_choice=choice,
                                       parallel_tool_calls=False, max_tokens=120, seed=5)  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    if choice == "required":
        assert call.function.name in ("get_time", "get_weather")
    else:
        assert call.function.name == "get_weather"
    if call.function.name == "get_weather":
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_streamed_tool_call_assembles_in_the_client(client):
    kw = dict(
        model="testmix",
        messages=USER,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=200,
        seed=8,
        parallel_tool_calls=False,
    )
    whole = client.chat.completions.create(**kw).choices[0]
    with client.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert [(t.function.name, t.function.arguments) for t in final.message.tool_calls] == [
        (t.function.name, t.function.arguments) for t in whole.message.tool_calls
    ]
    for t in final.message.tool_calls:
        jsonschema.validate(json.loads(t.function.arguments), WEATHER["function"]["parameters"])


def test_a_conversation_with_tool_results_renders(client):
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]  # fmt: skip
    r = client.chat.completions.create(model="testmix", messages=messages, tools=[WEATHER], tool_choice="none",
                                       max_tokens=4, seed=1)  # fmt: skip
    assert r.choices[0].message.tool_calls is None and r.usage.prompt_tokens > 60


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"response_format": _schema_format({"type": "string", "pattern": "(("})}, "response_format.json_schema.schema"),
        ({"response_format": _schema_format({"$ref": "#/$defs/missing"})}, "response_format.json_schema.schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
         "tools[0].function.parameters"),
        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format"),
    ],
)  # fmt: skip
def test_bad_structured_input_is_a_400(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="testmix", messages=USER, max_tokens=4, extra_body=extra)
    assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body


def _assembled(chunks, mistral: bool = False) -> tuple[str, list[tuple[str, str]], list[int], str | None]:
    """What a client makes of streamed chunks: (content, calls as (name, arguments), the number of argument
    fragments per call, the finish reason), checking that a call's first entry has its id, type and name and
    its later ones only arguments."""
    content, calls, fragments, reason = "", [], [], None
    for chunk in chunks:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            reason = ch.finish_reason or reason
            for t in ch.delta.tool_calls or ():
                if t.index == len(calls):
                    shaped = len(t.id) == 9 and t.id.isalnum() if mistral else t.id.startswith("call_")
                    assert shaped and t.type == "function" and t.function.name, t
                    calls.append([t.function.name, ""])
                    fragments.append(0)
                else:
                    assert t.index == len(calls) - 1 and t.id is None and t.function.name is None, t
                fragments[-1] += bool(t.function.arguments)
                calls[-1][1] += t.function.arguments or ""
    return content, [tuple(c) for c in calls], fragments, reason


def test_streamed_tool_calls_arrive_in_fragments_and_equal_the_whole_answer(client):
    """Parallel calls (one or more, `index` 0, 1, ...), their arguments streamed as the model writes them;
    for each seed the streamed calls are the whole answer's, and no text of a call is content."""
    counts, most = [], 0
    for seed in range(6):
        kw = dict(model="testmix", messages=USER, tools=[TIME, WEATHER], tool_choice="required", max_tokens=200,
                  seed=seed)  # fmt: skip
        whole = client.chat.completions.create(**kw).choices[0]
        content, calls, fragments, reason = _assembled(client.chat.completions.create(stream=True, **kw))
        # "length" where the calls went on to max_tokens (the last one cut off, alike in both)
        assert reason == whole.finish_reason in ("tool_calls", "length") and content == ""
        assert calls == [(t.function.name, t.function.arguments) for t in whole.message.tool_calls], seed
        counts.append(len(calls))
        most = max(
            [most, *(f for (name, _), f in zip(calls, fragments, strict=True) if name == "get_weather")]
        )
    assert max(counts) >= 2, counts  # some answer made parallel calls
    assert most >= 5  # get_weather's arguments came in many pieces


def test_llama3_json_tool_calls_served_whole_and_streamed(llama_client):
    """The template decides the syntax: the forced output is Llama 3's `{"name": ..., "parameters": ...}`, read
    back as `tool_calls`, streamed alike."""
    for seed in range(3):
        kw = dict(model="testmix", messages=USER, tools=[TIME, WEATHER], max_tokens=200, seed=seed,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})  # fmt: skip
        whole = llama_client.chat.completions.create(**kw).choices[0]
        assert whole.finish_reason == "tool_calls" and whole.message.content is None
        (call,) = whole.message.tool_calls
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        content, calls, _, reason = _assembled(llama_client.chat.completions.create(stream=True, **kw))
        assert (content, calls, reason) == ("", [("get_weather", call.function.arguments)], "tool_calls")


def test_mistral_tool_calls_served_and_sent_back(mistral_client):
    """The forced output is Mistral's list `[{"name": ..., "arguments": ...}, ...]`, read back as `tool_calls`
    (streamed alike) with the 9-character ids the template checks, so the calls and their results render in
    the next turn."""
    kw = dict(
        model="testmix", messages=USER, tools=[TIME, WEATHER], max_tokens=200, seed=1, tool_choice="required"
    )
    whole = mistral_client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None and whole.message.tool_calls
    for call in whole.message.tool_calls:
        assert len(call.id) == 9 and call.id.isalnum() and call.function.name in ("get_time", "get_weather")
        json.loads(call.function.arguments)
    content, calls, _, reason = _assembled(
        mistral_client.chat.completions.create(stream=True, **kw), mistral=True
    )
    assert reason == "tool_calls" and calls == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
    results = [{"role": "tool", "tool_call_id": c.id, "content": "sunny"} for c in whole.message.tool_calls]
    turn = [*USER, whole.message.model_dump(exclude_none=True), *results]
    nxt = mistral_client.chat.completions.create(
        model="testmix", messages=turn, tools=[TIME, WEATHER], max_tokens=4
    )
    assert nxt.choices[0].finish_reason in ("stop", "length", "tool_calls")
