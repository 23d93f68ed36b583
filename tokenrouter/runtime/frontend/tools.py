"""Tools: what a request's `tools` / `tool_choice` mean for its prompt, its output and its response.

The tools reach the model through the chat template's `tools` variable (Qwen / Hermes and Llama 3 templates read
it; a template that does not is a 400). The template also decides the syntax the answer's calls are written in
(`tool_syntax.detect`): Hermes / Qwen `<tool_call>` blocks, Llama 3 JSON or Mistral's `[TOOL_CALLS]` list; a
template teaching none of them is a 400 unless tool_choice is "none". `tool_choice`: "auto" (the default with
tools) parses what the model writes; "none" leaves the text as it is; "required" and a named function constrain
the output to calls (`structured.tool_grammar`).

`ToolStream` splits one answer, as its text arrives, into content and calls: a call goes out as soon as its name
is read (`id`, `type`, `function.name`), its arguments as their JSON text comes, and text inside a call never
becomes content. `parse_tool_calls` runs the same stream over a whole answer, so that a streamed answer
assembles into the message the whole one gives.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

from tokenrouter.runtime.frontend import tool_syntax as ts
from tokenrouter.runtime.frontend.protocol import APIError, FunctionDef


@dataclass(slots=True)
class ToolPlan:
    """A request's tools and its choice among them: "auto", "none", "required" or a function's name."""

    functions: list[FunctionDef]
    choice: str = "auto"
    named: bool = False  # `choice` is a function's name
    parallel: bool = True
    syntax: ts.ToolSyntax | None = ts.HERMES  # how the model writes a call (None: a syntax not parsed)

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


def plan_tools(req, template: str | None) -> ToolPlan | None:
    """The request's ToolPlan (None without tools), its call syntax the one the chat `template` teaches; a 400
    for a tool_choice the tools cannot honour, or one that parses calls where the syntax is not known."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        return None
    functions, syntax = [t.function for t in req.tools], _detect(template)
    if choice is None or isinstance(choice, str):
        plan = ToolPlan(functions, choice or "auto", parallel=req.parallel_tool_calls, syntax=syntax)
    else:
        names = [f.name for f in functions]
        if choice.function.name not in names:
            raise APIError(400, f"tool_choice names function {choice.function.name!r}, which is not among the "
                                f"tools ({', '.join(names)})", param="tool_choice")  # fmt: skip
        plan = ToolPlan(functions, choice.function.name, named=True, parallel=False, syntax=syntax)
    if plan.parses and syntax is None:
        raise APIError(400, ts.unsupported_message(template), param="tools")
    return plan


@functools.lru_cache(maxsize=8)
def _detect(template: str | None) -> ts.ToolSyntax | None:
    return ts.detect(template)


def parse_tool_calls(text: str, syntax: ts.ToolSyntax = ts.HERMES) -> tuple[str | None, list[dict]]:
    """(content, tool calls) of a whole answer, as `ToolStream` splits it: the content is the text outside
    the calls (None when blank). Without a call: (text, [])."""
    stream = ToolStream(syntax)
    deltas = [stream.feed(text), stream.finish()]
    if not stream.calls:
        return text, []
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for entry in (e for d in deltas for e in d.get("tool_calls", ())):
        if "id" in entry:  # a call's first entry
            fn = {"name": entry["function"]["name"], "arguments": ""}
            calls[entry["index"]] = {"id": entry["id"], "type": entry["type"], "function": fn}
        calls[entry["index"]]["function"]["arguments"] += entry["function"]["arguments"]
    ordered = [calls[i] for i in sorted(calls)]
    return (content if content.strip() else None), ordered


def tool_message(
    text: str, finish_reason: str | None, syntax: ts.ToolSyntax = ts.HERMES
) -> tuple[dict, str | None]:
    """A whole answer as an assistant message with its calls parsed, and its finish reason ("tool_calls"
    where a call ended it)."""
    content, calls = parse_tool_calls(text, syntax)
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    msg = {"role": "assistant", "content": content, "tool_calls": calls}
    return msg, "tool_calls" if finish_reason == "stop" else finish_reason


class ToolStream:
    """One answer's text, fed as it arrives, split into `delta`s of a chat stream: `content` for the text
    outside calls, `tool_calls` entries for the calls. A call's first entry (once its name is read) has its
    `index` (0, 1, ... in the answer), `id`, `type` and `function.name`; its arguments follow as fragments of
    their JSON text as the model writes them. A possible opener is held back until it is one or is not;
    whitespace between content and a call is dropped. A call whose JSON does not begin with its name is sent
    whole when it ends; a block that is no call (no name, arguments not an object, not JSON) is content."""

    def __init__(self, syntax: ts.ToolSyntax = ts.HERMES) -> None:
        self.syntax = syntax
        self.buf = ""  # text not yet settled: held content, or the current call's payload
        self.block: _Block | None = None
        self.calls = 0  # calls begun so far
        self.space = ""  # trailing whitespace of the content, held until content follows it
        self.may_start = True  # only whitespace and calls so far (where Llama 3 JSON may begin a call)
        self.after_call = False  # the last thing settled was a call

    def feed(self, text: str) -> dict:
        """The delta `text` adds ({} for none yet)."""
        out = _Delta(self.syntax.call_id)
        self.buf += text
        while self._step(out):
            pass
        return out.delta()

    def finish(self) -> dict:
        """The answer ended: the last delta (a call cut off keeps what it has; held text is content)."""
        out = _Delta(self.syntax.call_id)
        if self.block is not None:
            self._close(len(self.buf), len(self.buf), out)
        self._content(self.buf, out)
        self.buf = ""
        if not self.calls:
            out.text(self.space)
        return out.delta()

    def _step(self, out: _Delta) -> bool:
        """Settle what can be settled; True where more may be."""
        if self.block is None:
            found = self.syntax.find_call(self.buf, self.may_start)
            if found.call is None:
                self._content(self.buf[: found.content], out)
                self.buf = self.buf[found.content :]
                return False
            self._content(self.buf[: found.call], out)
            self.space = ""  # whitespace before a call is dropped
            self.block = _Block(self.buf[found.call : found.payload])
            self.buf = self.buf[found.payload :]
        block = self.block
        block.outer.feed(self.buf)
        if block.index is None and (name := block.read_header(self.buf)) is not None:
            block.index, self.calls = self.calls, self.calls + 1
            out.call(block.index, name)
        block.send_args(self.buf, out)
        end = self.syntax.block_end(self.buf, block.search_from(), block.outer.end)
        if end is None:
            return False
        self._close(*end, out)
        return True

    def _close(self, end: int, resume: int, out: _Delta) -> None:
        """The current block's payload is `buf[:end]`; the text after it starts at `buf[resume:]`."""
        block, self.block = self.block, None
        payload, closer, self.buf = self.buf[:end], self.buf[end:resume], self.buf[resume:]
        if block.index is None:  # not streamed: a call in another key order, or no call at all
            call = ts.whole_call(payload)
            if call is None:
                self._content(block.opener + payload + closer, out)
                return
            out.call(self.calls, call[0])
            out.args(self.calls, call[1])
            self.calls += 1
        self.after_call = self.may_start = True

    def _content(self, text: str, out: _Delta) -> None:
        """Send content text, holding its trailing whitespace back (and dropping what follows a call)."""
        if self.after_call:
            text = text.lstrip()
        text = self.space + text
        body = text.rstrip()
        self.space = text[len(body) :]
        if body:
            out.text(body)
            self.after_call = self.may_start = False


class _Block:
    """One call's payload as it streams: where its JSON object ends (`outer`), its index once its header
    (the name, then the arguments) was read, and how much of the arguments' text went out."""

    def __init__(self, opener: str) -> None:
        self.opener = opener
        self.outer = ts.JsonScan()
        self.index: int | None = None
        self.args_at = 0  # where the arguments begin in the payload
        self.args = ts.JsonScan()
        self.sent = 0  # arguments' characters sent

    def read_header(self, payload: str) -> str | None:
        """The call's name if the payload's header is complete (and `args_at` set), else None."""
        m = ts.HEADER.match(payload)
        if m is None:
            return None
        try:
            name = json.loads(m.group(1))
        except ValueError:
            return None
        self.args_at = m.end()
        return name

    def send_args(self, payload: str, out: _Delta) -> None:
        """Send the arguments' text that came since the last time."""
        if self.index is None:
            return
        end = self.args.feed(payload, self.args_at)
        upto = end if end is not None else len(payload) - self.args_at
        out.args(self.index, payload[self.args_at + self.sent : self.args_at + upto])
        self.sent = upto

    def search_from(self) -> int | None:
        """Where a closer may begin: after the arguments (None while they are being written), else after
        the JSON object, else anywhere."""
        if self.index is not None:
            return None if self.args.end is None else self.args_at + self.args.end
        return self.outer.end or 0


class _Delta:
    """What one step of a ToolStream adds: content text and tool-call entries (merged per call)."""

    def __init__(self, call_id: Callable[[], str]) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict] = {}
        self.call_id = call_id  # a new call's id (the syntax's: some templates check their shape)

    def text(self, s: str) -> None:
        if s:
            self.content.append(s)

    def call(self, index: int, name: str) -> None:
        fn = {"name": name, "arguments": ""}
        self.calls[index] = {
            "index": index,
            "id": self.call_id(),
            "type": "function",
            "function": fn,
        }

    def args(self, index: int, s: str) -> None:
        entry = self.calls.setdefault(index, {"index": index, "function": {"arguments": ""}})
        entry["function"]["arguments"] += s

    def delta(self) -> dict:
        d: dict = {"content": "".join(self.content)} if self.content else {}
        calls = [c for c in self.calls.values() if "id" in c or c["function"]["arguments"]]
        if calls:
            d["tool_calls"] = calls
        return d
