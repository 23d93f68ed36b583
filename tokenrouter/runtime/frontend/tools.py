"""Tools: what a request's `tools` / `tool_choice` mean for its prompt, its output and its response.

The tools reach the model through the chat template's `tools` variable (Qwen / Hermes-style templates read it;
a template that does not is a 400). The answer's calls are written in the Hermes / Qwen syntax, one block each:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`parse_tool_calls` turns them into OpenAI's `message.tool_calls` (arguments as a JSON string), the text before
the first block being the message's content. `tool_choice`: "auto" (the default with tools) parses what the
model writes; "none" leaves the text as it is; "required" and a named function constrain the output to calls
(`structured.tool_grammar`). Streaming (`ToolStream`): text is sent as content until a `<tool_call>` begins;
the calls go out whole, one `delta.tool_calls` entry each, when the choice ends.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from tokenrouter.runtime.frontend.protocol import APIError, FunctionDef

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|\Z)", re.DOTALL)


@dataclass(slots=True)
class ToolPlan:
    """A request's tools and its choice among them: "auto", "none", "required" or a function's name."""

    functions: list[FunctionDef]
    choice: str = "auto"
    named: bool = False  # `choice` is a function's name
    parallel: bool = True

    @property
    def forced(self) -> bool:
        """The output must be calls (constrained decoding)."""
        return self.named or self.choice == "required"

    @property
    def parses(self) -> bool:
        """The answer's calls become `tool_calls`."""
        return self.named or self.choice != "none"

    def allowed(self) -> list[FunctionDef]:
        return [f for f in self.functions if f.name == self.choice] if self.named else list(self.functions)

    def choice_text(self) -> str:
        return f"function {self.choice}" if self.named else self.choice

    def template_tools(self) -> list[dict]:
        """The `tools` variable of the chat template, as transformers passes it (OpenAI's tool objects)."""
        return [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in self.functions]


def plan_tools(req) -> ToolPlan | None:
    """The request's ToolPlan (None without tools); a 400 for a tool_choice the tools cannot honour."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        return None
    if choice is None or isinstance(choice, str):
        return ToolPlan([t.function for t in req.tools], choice or "auto", parallel=req.parallel_tool_calls)
    names = [t.function.name for t in req.tools]
    if choice.function.name not in names:
        raise APIError(
            400,
            f"tool_choice names function {choice.function.name!r}, which is not among the tools ({', '.join(names)})",
            param="tool_choice",
        )
    return ToolPlan([t.function for t in req.tools], choice.function.name, named=True, parallel=False)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool calls) of an answer: every `<tool_call>` block whose JSON has a string `name` and an
    object `arguments` becomes a call (a last block cut off before `</tool_call>` counts where its JSON is
    whole); the text before the first block is the content (None when blank). Without a valid call: (text,
    [])."""
    calls = [call for m in _BLOCK.finditer(text) if (call := _tool_call(m.group(1))) is not None]
    if not calls:
        return text, []
    content = text[: text.index(CALL_OPEN)]
    return (content if content.strip() else None), calls


def _tool_call(block: str) -> dict | None:
    """The call a `<tool_call>` block's JSON makes (a string `name`, object `arguments`), or None."""
    try:
        obj = json.loads(block)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, dict):
        return None
    return {
        "id": "call_" + secrets.token_hex(12),
        "type": "function",
        "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)},
    }


class ToolStream:
    """One streamed choice's text split into content, sent as it comes, and calls, sent when it ends: `feed`
    returns the content that can go out now (a possible start of `<tool_call>` is held back), `finish` the
    rest of the content and the calls."""

    def __init__(self) -> None:
        self.held = ""  # text from the first `<tool_call>` (or a possible start of one) on

    def feed(self, text: str) -> str:
        if self.held.startswith(CALL_OPEN):
            self.held += text
            return ""
        buf = self.held + text
        at = buf.find(CALL_OPEN)
        if at < 0:
            at = len(buf) - _partial_open(buf)
        out, self.held = buf[:at], buf[at:]
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """(content not sent yet, the calls): held text without a valid call is content after all."""
        rest, self.held = self.held, ""
        if rest.startswith(CALL_OPEN):
            _, calls = parse_tool_calls(rest)
            if calls:
                return "", calls
        return rest, []


def _partial_open(text: str) -> int:
    """The length of the longest end of `text` that begins `<tool_call>`."""
    for k in range(min(len(text), len(CALL_OPEN) - 1), 0, -1):
        if CALL_OPEN.startswith(text[-k:]):
            return k
    return 0


def tool_message(text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """A whole answer as an assistant message with its calls parsed, and its finish reason ("tool_calls"
    where a call ended it)."""
    content, calls = parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    msg = {"role": "assistant", "content": content, "tool_calls": calls}
    return msg, "tool_calls" if finish_reason == "stop" else finish_reason


def call_deltas(calls: list[dict]) -> list[dict]:
    """The calls as streamed `delta.tool_calls` entries (each whole, with its index)."""
    return [{"index": i, **c} for i, c in enumerate(calls)]
