"""The tool-call syntax of Hermes / Qwen chat templates, parsed back: a call the template formats (as it renders
an assistant's earlier calls) comes back as the same OpenAI `tool_calls`, whole and split across streamed text
at every point; text that is not a valid call stays content."""

from __future__ import annotations

import json
import shutil

import pytest
from frontend_helpers import MODELS
from test_structured_output import TOOLS_TEMPLATE

from tokenrouter.runtime.frontend.codec import TextCodec
from tokenrouter.runtime.frontend.protocol import ChatCompletionRequest, parse_body
from tokenrouter.runtime.frontend.tools import ToolStream, parse_tool_calls, plan_tools, tool_message

CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris <3"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "CET", "n": [1, 2]}'}},
]  # fmt: skip


@pytest.fixture(scope="module")
def answer(tmp_path_factory) -> str:
    """What the template writes for an assistant turn with CALLS: the text a model is taught to produce."""
    folder = tmp_path_factory.mktemp("models") / "tools-small"
    shutil.copytree(MODELS / "tiny-small", folder)
    (folder / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": CALLS},
        ]
    }
    req = parse_body(ChatCompletionRequest, json.dumps(body).encode())
    text = TextCodec(folder).apply_chat_template(req.template_messages(), add_generation_prompt=False)
    start = text.index("<|im_start|>assistant") + len("<|im_start|>assistant\n")
    return "Let me check." + text[start : text.rindex("<|im_end|>")]


def _plain(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_a_template_formatted_answer_parses_into_its_calls(answer):
    assert answer.count("<tool_call>") == 2
    content, calls = parse_tool_calls(answer)
    assert content == "Let me check."
    assert _plain(calls) == _plain(CALLS)
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    msg, reason = tool_message(answer, "stop")
    assert reason == "tool_calls" and msg["content"] == "Let me check."
    assert _plain(msg["tool_calls"]) == _plain(CALLS)


def test_streamed_pieces_give_the_same_content_and_calls(answer):
    for cut in range(len(answer) + 1):
        for step in (1, 3, 7):
            s = ToolStream()
            pieces = [answer[:cut]] + [answer[i : i + step] for i in range(cut, len(answer), step)]
            sent = "".join(s.feed(p) for p in pieces)
            rest, calls = s.finish()
            assert sent + rest == "Let me check." and _plain(calls) == _plain(CALLS), (cut, step)


@pytest.mark.parametrize(
    "text",
    [
        "no calls here",
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',  # arguments not an object
        "a < b <tool_",  # a possible start that never becomes a call
    ],
)
def test_text_without_a_valid_call_stays_content(text):
    assert parse_tool_calls(text) == (text, [])
    s = ToolStream()
    sent = "".join(s.feed(c) for c in text)
    rest, calls = s.finish()
    assert sent + rest == text and calls == []
    assert tool_message(text, "stop") == ({"role": "assistant", "content": text}, "stop")


def test_a_call_cut_off_before_its_closing_tag_still_counts_when_its_json_is_whole():
    content, calls = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"a": 1}}')
    assert content is None and _plain(calls) == [("f", {"a": 1})]


def test_tool_choice_plans():
    def plan(**body):
        body = {"messages": [{"role": "user", "content": "hi"}], **body}
        return plan_tools(parse_body(ChatCompletionRequest, json.dumps(body).encode()))

    tools = [{"type": "function", "function": {"name": n}} for n in ("f", "g")]
    assert plan() is None and plan(tool_choice="none") is None
    auto = plan(tools=tools)
    assert auto.parses and not auto.forced and [f.name for f in auto.allowed()] == ["f", "g"]
    assert not plan(tools=tools, tool_choice="none").parses
    required = plan(tools=tools, tool_choice="required", parallel_tool_calls=False)
    assert required.forced and not required.parallel
    named = plan(tools=tools, tool_choice={"type": "function", "function": {"name": "g"}})
    assert named.forced and [f.name for f in named.allowed()] == ["g"]
    assert auto.template_tools() == [{"type": "function", "function": {"name": "f"}},
                                     {"type": "function", "function": {"name": "g"}}]  # fmt: skip
