"""The tool-call syntaxes parsed back (no model): an answer a chat template formats (as it renders an
assistant's earlier calls) comes back as the same OpenAI `tool_calls`, whole and streamed, split at every
point, for Hermes / Qwen `<tool_call>` blocks and Llama 3 JSON; the stream's deltas are what the `openai`
client assembles (a call's first entry with its id, type and name, its arguments in fragments after); text
that is not a valid call stays content; the syntax is chosen from the chat template, and an unknown one is a
400 unless tool_choice is "none"."""

from __future__ import annotations

import json
import shutil

import llguidance
import pytest
from frontend_helpers import MODELS
from test_structured_output import LLAMA3_TEMPLATE, MISTRAL_TEMPLATE, TOOLS_TEMPLATE

from tokenrouter.runtime import grammar as g
from tokenrouter.runtime.frontend import tool_syntax as ts
from tokenrouter.runtime.frontend.codec import TextCodec
from tokenrouter.runtime.frontend.protocol import APIError, ChatCompletionRequest, FunctionDef, parse_body
from tokenrouter.runtime.frontend.structured import tool_grammar
from tokenrouter.runtime.frontend.tools import (
    ToolPlan,
    ToolStream,
    parse_tool_calls,
    plan_tools,
    tool_message,
)

CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris <3"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "CET", "n": [1, 2]}'}},
]  # fmt: skip
# a newer Mistral template (calls as [TOOL_CALLS]name[ARGS]{...}): not parsed
MISTRAL_V11_TEMPLATE = "{%- for m in messages %}{%- if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls[0].function.name }}[ARGS]{%- endif %}{%- endfor %}{{ tools }}"  # fmt: skip
MISTRAL_IDS = ("aB3dE6gH9", "Zy8xW7vU6")


def _codec(tmp_path_factory, name: str, template: str) -> TextCodec:
    folder = tmp_path_factory.mktemp("models") / name
    shutil.copytree(MODELS / "tiny-small", folder)
    (folder / "chat_template.jinja").write_text(template)
    return TextCodec(folder)


def _rendered(codec: TextCodec, calls: list[dict]) -> str:
    """The text the template writes for an assistant turn with `calls`: what a model is taught to produce."""
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": calls},
        ]
    }
    req = parse_body(ChatCompletionRequest, json.dumps(body).encode())
    return codec.apply_chat_template(req.template_messages(), add_generation_prompt=False)


@pytest.fixture(scope="module")
def hermes_answer(tmp_path_factory) -> str:
    text = _rendered(_codec(tmp_path_factory, "hermes", TOOLS_TEMPLATE), CALLS)
    start = text.index("<|im_start|>assistant") + len("<|im_start|>assistant\n")
    return "Let me check." + text[start : text.rindex("<|im_end|>")]


@pytest.fixture(scope="module")
def llama_answer(tmp_path_factory) -> str:
    """Two calls, each rendered by the template (it renders one per turn), a `; ` apart as Llama 3 writes
    parallel calls."""
    codec = _codec(tmp_path_factory, "llama", LLAMA3_TEMPLATE)
    head = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    turns = [_rendered(codec, [c]) for c in CALLS]
    return "; ".join(t[t.rindex(head) + len(head) : t.rindex("<|eot_id|>")] for t in turns)


@pytest.fixture(scope="module")
def mistral_answer(tmp_path_factory) -> str:
    """The template's list of two calls, after its [TOOL_CALLS] tag (a special token: the answer's text, as the
    server decodes it, leaves it out)."""
    codec = _codec(tmp_path_factory, "mistral", MISTRAL_TEMPLATE)
    text = _rendered(codec, [{**c, "id": i} for c, i in zip(CALLS, MISTRAL_IDS, strict=True)])
    return text[text.rindex("[TOOL_CALLS]") + len("[TOOL_CALLS]") : text.rindex("]") + 1]


def _answer(syntax: str, hermes_answer: str, llama_answer: str, mistral_answer: str):
    return {"hermes": (hermes_answer, ts.HERMES), "llama": (llama_answer, ts.LLAMA3_JSON),
            "mistral": (mistral_answer, ts.MISTRAL)}[syntax]  # fmt: skip


def _plain(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def _id_of(syntax: ts.ToolSyntax, call_id: str) -> bool:
    """`call_id` has the shape the syntax gives: 9 letters and digits for Mistral, else `call_…`."""
    return len(call_id) == 9 and call_id.isalnum() if syntax is ts.MISTRAL else call_id.startswith("call_")


def _assemble(deltas: list[dict], syntax: ts.ToolSyntax = ts.HERMES) -> tuple[str, list[dict]]:
    """What the `openai` client's streaming makes of the deltas, checking the entries' shape on the way: a
    call's first entry (the next index) has its id, type and name; its later ones only arguments."""
    content, calls = "", []
    for d in deltas:
        content += d.get("content", "")
        for e in d.get("tool_calls", ()):
            if e["index"] == len(calls):
                assert _id_of(syntax, e["id"]) and e["type"] == "function" and e["function"]["name"]
                calls.append({"id": e["id"], "type": "function", "function": dict(e["function"])})
            else:
                assert e["index"] == len(calls) - 1 and set(e) == {"index", "function"}, e
                assert set(e["function"]) == {"arguments"} and e["function"]["arguments"]
                calls[-1]["function"]["arguments"] += e["function"]["arguments"]
    return content, calls


def _stream(syntax: ts.ToolSyntax, pieces: list[str]) -> tuple[list[dict], ToolStream]:
    s = ToolStream(syntax)
    deltas = [s.feed(p) for p in pieces]
    return [*deltas, s.finish()], s


def test_a_hermes_answer_parses_into_its_calls(hermes_answer):
    assert hermes_answer.count("<tool_call>") == 2
    content, calls = parse_tool_calls(hermes_answer, ts.HERMES)
    assert content == "Let me check."
    assert _plain(calls) == _plain(CALLS)
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    msg, reason = tool_message(hermes_answer, "stop", ts.HERMES)
    assert reason == "tool_calls" and msg["content"] == "Let me check."
    assert _plain(msg["tool_calls"]) == _plain(CALLS)


def test_a_llama3_answer_parses_into_its_calls(llama_answer):
    assert llama_answer.startswith('{"name": "get_weather", "parameters": {"city": "Paris <3"}}; {"name"')
    for text in (llama_answer, "<|python_tag|>" + llama_answer, " \n" + llama_answer):
        content, calls = parse_tool_calls(text, ts.LLAMA3_JSON)
        assert content is None and _plain(calls) == _plain(CALLS)


def test_a_mistral_answer_parses_into_its_calls(mistral_answer):
    assert mistral_answer.startswith(' [{"name": "get_weather", "arguments": {"city": "Paris <3"}, "id": "')
    for text in (mistral_answer, "[TOOL_CALLS]" + mistral_answer, "[TOOL_CALLS][" + mistral_answer[2:]):
        content, calls = parse_tool_calls(text, ts.MISTRAL)
        assert content is None and _plain(calls) == _plain(CALLS), text
        assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls)
    content, calls = parse_tool_calls("Checking.[TOOL_CALLS]" + mistral_answer + " Done.", ts.MISTRAL)
    assert content == "Checking.Done." and _plain(calls) == _plain(CALLS)  # the whitespace by a call dropped


@pytest.mark.parametrize("syntax", ["hermes", "llama", "mistral"])
def test_streamed_pieces_assemble_into_the_whole_answer(syntax, hermes_answer, llama_answer, mistral_answer):
    answer, syn = _answer(syntax, hermes_answer, llama_answer, mistral_answer)
    whole_content, whole_calls = parse_tool_calls(answer, syn)
    for cut in range(len(answer) + 1):
        for step in (1, 3, 7):
            pieces = [answer[:cut]] + [answer[i : i + step] for i in range(cut, len(answer), step)]
            deltas, s = _stream(syn, pieces)
            content, calls = _assemble(deltas, syn)
            assert content == (whole_content or "") and s.calls == 2, (cut, step)
            assert [c["function"] for c in calls] == [c["function"] for c in whole_calls], (cut, step)


def test_arguments_stream_as_they_are_written(hermes_answer):
    """Fed a character at a time, a call's name goes out as soon as its header is whole, and each character
    of its arguments as it comes; nothing of a block leaks as content."""
    deltas, _ = _stream(ts.HERMES, list(hermes_answer))
    first = hermes_answer.index('{"city"')
    header = next(i for i, d in enumerate(deltas) if d.get("tool_calls"))
    head = deltas[header]["tool_calls"][0]["function"]
    assert header == first and head == {"name": "get_weather", "arguments": "{"}
    fragments = [
        e["function"]["arguments"] for d in deltas for e in d.get("tool_calls", ()) if e["index"] == 0
    ]
    assert "".join(fragments) == '{"city": "Paris <3"}' and len(fragments) == len('{"city": "Paris <3"}')
    assert "".join(d.get("content", "") for d in deltas) == "Let me check."


def test_an_opener_split_across_pieces_is_held_back():
    deltas, s = _stream(ts.HERMES, ["ok <tool", "_ca", 'll>\n{"name": "f", "arguments": {}}\n</tool_call>'])
    assert deltas[0] == {"content": "ok"} and deltas[1] == {}
    assert _assemble(deltas)[0] == "ok" and s.calls == 1
    deltas, s = _stream(ts.LLAMA3_JSON, ["<|py", "thon_tag|>", '{"name": "f", "parameters": {"a": 1}}'])
    content, calls = _assemble(deltas)
    assert (
        deltas[:2] == [{}, {}]
        and content == ""
        and calls[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    )


def test_a_call_not_led_by_its_name_goes_out_whole_when_it_ends():
    for syn, text in ((ts.HERMES, '<tool_call>\n{"arguments": {"a": 1}, "name": "f"}\n</tool_call>'),
                      (ts.LLAMA3_JSON, '{"parameters": {"a": 1}, "name": "f"}')):  # fmt: skip
        deltas, _ = _stream(syn, list(text))
        sent_at = [i for i, d in enumerate(deltas) if d.get("tool_calls")]
        assert sent_at == [len(text) - 1]  # with its last character
        content, calls = _assemble(deltas)
        assert content == "" and _plain(calls) == [("f", {"a": 1})]


@pytest.mark.parametrize(
    "syntax,text",
    [
        ("hermes", "no calls here"),
        ("hermes", "<tool_call>\n{not json}\n</tool_call>"),
        ("hermes", '<tool_call>\n{"arguments": {}}\n</tool_call>'),  # no name
        ("hermes", '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'),  # arguments not an object
        ("hermes", "a < b <tool_"),  # a possible start that never becomes a call
        ("llama", 'Sure: {"name": "f", "parameters": {}}'),  # a call only as the whole message
        ("llama", '{"city": "Paris"}'),  # JSON that is no call
        ("llama", '{"name": "Paris", "country": "France"}'),  # nor is this: it has no arguments
        ("llama", '{"name": "f", "parameters": [1]}'),
        ("llama", "<|python_tag|>print(1)"),
        ("llama", "<|python"),
        ("mistral", "[1, 2, 3]"),  # a list, not of calls
        ("mistral", '[{"city": "Paris"}]'),
        (
            "mistral",
            'See [{"name": "f", "arguments": {}}]',
        ),  # a list of calls, not at the start, without the tag
        ("mistral", "[TOOL_CALLS] no list"),
        ("mistral", "["),
    ],
)
def test_text_without_a_valid_call_stays_content(syntax, text):
    syn = {"hermes": ts.HERMES, "llama": ts.LLAMA3_JSON, "mistral": ts.MISTRAL}[syntax]
    assert parse_tool_calls(text, syn) == (text, [])
    deltas, s = _stream(syn, list(text))
    assert _assemble(deltas) == (text, []) and s.calls == 0
    assert tool_message(text, "stop", syn) == ({"role": "assistant", "content": text}, "stop")


def test_a_call_cut_off_keeps_what_was_written():
    content, calls = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"a": 1}}')
    assert content is None and _plain(calls) == [("f", {"a": 1})]
    _, calls = parse_tool_calls('{"name": "f", "parameters": {"a": [1, ', ts.LLAMA3_JSON)
    assert calls[0]["function"] == {"name": "f", "arguments": '{"a": [1, '}


def test_content_after_a_call_and_the_whitespace_around_calls():
    text = 'Sure.\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n\nDone, see above. '
    content, calls = parse_tool_calls(text)
    assert content == "Sure.Done, see above." and len(calls) == 1


def test_the_syntax_is_detected_from_the_chat_template(tmp_path_factory):
    hermes = _codec(tmp_path_factory, "h", TOOLS_TEMPLATE).template_source
    llama = _codec(tmp_path_factory, "l", LLAMA3_TEMPLATE).template_source
    assert ts.detect(hermes) is ts.HERMES and ts.detect(llama) is ts.LLAMA3_JSON
    assert ts.detect(MISTRAL_TEMPLATE) is ts.MISTRAL
    assert ts.detect(MISTRAL_V11_TEMPLATE) is None and ts.detect(None) is None
    assert "Mistral's [TOOL_CALLS]name[ARGS]" in ts.unsupported_message(MISTRAL_V11_TEMPLATE)
    assert "does not know" in ts.unsupported_message("{{ tools }}")


def _plan(template: str | None = TOOLS_TEMPLATE, **body) -> ToolPlan | None:
    body = {"messages": [{"role": "user", "content": "hi"}], **body}
    return plan_tools(parse_body(ChatCompletionRequest, json.dumps(body).encode()), template)


def test_tool_choice_plans():
    tools = [{"type": "function", "function": {"name": n}} for n in ("f", "g")]
    assert _plan() is None and _plan(tool_choice="none") is None
    auto = _plan(tools=tools)
    assert auto.parses and not auto.forced and [f.name for f in auto.allowed()] == ["f", "g"]
    assert auto.syntax is ts.HERMES and _plan(LLAMA3_TEMPLATE, tools=tools).syntax is ts.LLAMA3_JSON
    assert not _plan(tools=tools, tool_choice="none").parses
    required = _plan(tools=tools, tool_choice="required", parallel_tool_calls=False)
    assert required.forced and not required.parallel
    named = _plan(tools=tools, tool_choice={"type": "function", "function": {"name": "g"}})
    assert named.forced and [f.name for f in named.allowed()] == ["g"]
    assert auto.template_tools() == [{"type": "function", "function": {"name": "f"}},
                                     {"type": "function", "function": {"name": "g"}}]  # fmt: skip


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "f"}}])
def test_an_unknown_syntax_is_a_400_unless_the_answer_stays_text(choice):
    tools = [{"type": "function", "function": {"name": "f"}}]
    with pytest.raises(APIError) as e:
        _plan(MISTRAL_V11_TEMPLATE, tools=tools, tool_choice=choice)
    assert e.value.status == 400 and "[ARGS]" in e.value.body()["error"]["message"]
    assert _plan(MISTRAL_V11_TEMPLATE, tools=tools, tool_choice="none").syntax is None


@pytest.mark.parametrize("syntax", ["hermes", "llama", "mistral"])
def test_the_forced_grammar_accepts_the_template_formatted_calls(
    syntax, hermes_answer, llama_answer, mistral_answer
):
    """What `tool_choice: "required"` constrains the output to is the syntax the parser reads back."""
    answer, syn = _answer(syntax, hermes_answer, llama_answer, mistral_answer)
    calls_text = answer[answer.index("<tool_call>") :] if syntax == "hermes" else answer
    if syntax == "mistral":  # the list without the ids the template adds (the model's calls have none)
        calls_text = "[" + ", ".join(json.dumps({"name": c["function"]["name"],
                                                 "arguments": json.loads(c["function"]["arguments"])})
                                     for c in CALLS) + "]"  # fmt: skip
        assert _plain(parse_tool_calls(calls_text, syn)[1]) == _plain(CALLS)
    fns = [FunctionDef(name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}}),
           FunctionDef(name="get_time")]  # fmt: skip
    grammar = tool_grammar(ToolPlan(fns, "required", syntax=syn))
    tok = g.load_tokenizer(str(MODELS / "tiny-small"))
    matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    assert matcher.consume_tokens(tok.tokenize_str(calls_text)), calls_text
    assert matcher.is_accepting()
