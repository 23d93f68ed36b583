"""Structured output and tools with the `openai` client against a real `tokenrouter serve` (tiny models, CPU,
both writing): `response_format` JSON always parses and validates whichever model wrote its tokens, a required
or named tool call comes back as `tool_calls` (whole and streamed), and bad input is a 400. The entry model is a
copy of tiny-small whose chat template renders tools as Qwen's does."""

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
