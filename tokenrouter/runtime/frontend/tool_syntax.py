"""Tool-call syntaxes: how a model family writes a call in its answer, and how the answer is split back.

A syntax says three things (`ToolSyntax`): where a call begins in the answer's text (`find_call`: the opener,
held back while it may still be one), where the call's payload ends (`block_end`), and how the payload is
read: a JSON object `{"name": ..., "arguments" | "parameters": {...}}` (`HEADER` while it streams, `whole_call`
once it has ended). `tools.ToolStream` drives them. `SYNTAXES` is the registry, in the order `detect` tries it:
the first whose marker the chat template contains is the model's.

- `hermes` (Qwen 2.5 / 3, Hermes, and other templates that teach `<tool_call>`): each call a block
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, anywhere in the answer.
- `llama3_json` (Llama 3.1 / 3.2 / 3.3 with custom tools): the answer *is* the call, a JSON object
  `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`; several calls a `;` apart.
- `mistral` (Mistral 7B v0.3, Mixtral 8x22B, Mistral Nemo, Mistral Large 2407: the templates that write
  `[TOOL_CALLS]` and a JSON list): the answer is `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`. The
  tag is a special token, which the answer's text leaves out, so a list of calls at the answer's start is read
  the same with or without it. The templates require call ids of 9 letters and digits (`call_id`).

Templates of other families are named by `UNSUPPORTED` so that their error says which syntax it is (newer
Mistral templates, whose calls are `[TOOL_CALLS]name[ARGS]{...}`, among them).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

# the start of a call's JSON, as chat templates write it: the name first, then the arguments object
HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
_SEPARATOR = re.compile(r"\s*;?\s*")


@dataclass(frozen=True, slots=True)
class Opening:
    """Where `find_call` found a call in content text: `text[:content]` is content for sure; with `call`
    set, the opener spans `text[call:payload]` and the payload follows; without, `text[content:]` is held
    (it may still begin a call)."""

    content: int
    call: int | None = None
    payload: int | None = None


class ToolSyntax(ABC):
    """One family's tool-call syntax. Stateless: a `ToolStream` keeps the state of one answer."""

    name: ClassVar[str]
    families: ClassVar[str]  # the model families that write it, for messages and docs
    markers: ClassVar[tuple[str, ...]]  # text that a chat template teaching this syntax contains
    # the constrained output of a required or named tool_choice (structured.tool_grammar)
    call_open: ClassVar[str]
    call_close: ClassVar[str]
    separator: ClassVar[str]  # between parallel calls
    args_key: ClassVar[str]
    list_open: ClassVar[str] = ""  # around all the calls of an answer
    list_close: ClassVar[str] = ""
    not_markers: ClassVar[tuple[str, ...]] = ()  # text that rules this syntax out though a marker is there

    def call_id(self) -> str:
        """A new call's `id`."""
        return "call_" + secrets.token_hex(12)

    @abstractmethod
    def find_call(self, text: str, may_start: bool) -> Opening:
        """The first call's opener in `text` (content not yet sent). `may_start`: nothing but whitespace or
        calls came before `text`."""

    @abstractmethod
    def block_end(
        self, payload: str, search_from: int | None, object_end: int | None
    ) -> tuple[int, int] | None:
        """Where the payload ends and where the text after the call resumes, or None while it goes on.
        `search_from`: where a closer may begin (None while the arguments are still being written);
        `object_end`: the end of the payload's JSON object, once complete."""


class Hermes(ToolSyntax):
    name = "hermes"
    families = "Qwen 2.5 / 3, Hermes"
    markers = ("<tool_call>",)
    call_open, call_close, separator, args_key = "<tool_call>\n", "\n</tool_call>", "\n", "arguments"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def find_call(self, text: str, may_start: bool) -> Opening:
        at = text.find(self.OPEN)
        if at >= 0:
            return Opening(at, at, at + len(self.OPEN))
        return Opening(len(text) - partial_suffix(text, self.OPEN))

    def block_end(
        self, payload: str, search_from: int | None, object_end: int | None
    ) -> tuple[int, int] | None:
        if search_from is None:
            return None
        at = payload.find(self.CLOSE, search_from)
        return None if at < 0 else (at, at + len(self.CLOSE))


class Llama3Json(ToolSyntax):
    name = "llama3_json"
    families = "Llama 3.1 / 3.2 / 3.3"
    markers = ("dictionary of argument name and its value", "<|python_tag|>")
    call_open, call_close, separator, args_key = "", "", "; ", "parameters"
    TAG = "<|python_tag|>"

    def find_call(self, text: str, may_start: bool) -> Opening:
        if not may_start:
            return Opening(len(text))
        at = _SEPARATOR.match(text).end()
        rest = text[at:]
        if rest.startswith(self.TAG):
            at = _SEPARATOR.match(text, at + len(self.TAG)).end()
            rest = text[at:]
            if not rest:
                return Opening(0)
        elif self.TAG.startswith(rest):  # nothing yet, or a possible start of the tag
            return Opening(0)
        return Opening(0, 0, at) if rest[0] == "{" else Opening(len(text))

    def block_end(
        self, payload: str, search_from: int | None, object_end: int | None
    ) -> tuple[int, int] | None:
        return None if object_end is None else (object_end, object_end)


class MistralList(ToolSyntax):
    name = "mistral"
    families = "Mistral 7B v0.3, Mixtral 8x22B, Mistral Nemo"
    markers = ("[TOOL_CALLS]",)
    not_markers = ("[ARGS]",)
    call_open, call_close, separator, args_key = "", "", ", ", "arguments"
    list_open, list_close = "[", "]"
    TAG = "[TOOL_CALLS]"
    _OPEN = re.compile(r"\s*(?:\[TOOL_CALLS\])?\s*\[\s*(?=\{)")  # the list's start, before its first call
    _NEXT = re.compile(r"\s*,\s*(?=\{)")  # the next call of the list
    _ID_CHARS = string.ascii_letters + string.digits

    def call_id(self) -> str:
        return "".join(secrets.choice(self._ID_CHARS) for _ in range(9))

    def find_call(self, text: str, may_start: bool) -> Opening:
        if may_start:  # a list at the answer's start (its tag, if the text kept it), or the next call of one
            if m := self._OPEN.match(text) or self._NEXT.match(text):
                return Opening(0, 0, m.end())
            if self._may_open(text):
                return Opening(0)  # held: it may still open a list
        at = text.find(self.TAG)  # elsewhere, a tag the text kept (where the tokenizer's is not special)
        if at < 0:
            return Opening(len(text) - partial_suffix(text, self.TAG))
        if opened := self._OPEN.match(text, at):
            return Opening(at, at, opened.end())
        return Opening(at) if self._may_open(text[at:]) else Opening(len(text))

    def _may_open(self, text: str) -> bool:
        """`text` may still grow into a list's start or the next call of one."""
        rest = text.lstrip()
        if rest.startswith(self.TAG):
            rest = rest[len(self.TAG) :].lstrip()
        elif self.TAG.startswith(rest):
            return True
        return not rest or (rest[0] in "[," and not rest[1:].strip())

    def block_end(
        self, payload: str, search_from: int | None, object_end: int | None
    ) -> tuple[int, int] | None:
        if object_end is None:
            return None
        rest = payload[object_end:]
        after = rest.lstrip()
        if not after:
            return None  # the list goes on or closes: not known yet
        if after[0] == "]":
            return object_end, object_end + len(rest) - len(after) + 1
        return object_end, object_end  # `, {` (the next call, `find_call`) or whatever follows


HERMES, LLAMA3_JSON, MISTRAL = Hermes(), Llama3Json(), MistralList()
SYNTAXES: tuple[ToolSyntax, ...] = (HERMES, LLAMA3_JSON, MISTRAL)
UNSUPPORTED = {
    "[ARGS]": "Mistral's [TOOL_CALLS]name[ARGS]",
    "tool▁calls▁begin": "DeepSeek's <｜tool▁calls▁begin｜>",
}


def detect(template: str | None) -> ToolSyntax | None:
    """The syntax a chat template teaches (the first in SYNTAXES whose marker it contains), or None."""
    for syntax in SYNTAXES:
        if template and any(m in template for m in syntax.markers):
            if not any(m in template for m in syntax.not_markers):
                return syntax
    return None


def unsupported_message(template: str | None) -> str:
    """The 400's message for tools with a template whose call syntax is none of SYNTAXES."""
    known = "; ".join(f"{s.name} ({s.families})" for s in SYNTAXES)
    seen = next((what for m, what in UNSUPPORTED.items() if template and m in template), None)
    which = (
        f"writes tool calls as {seen}" if seen else "writes tool calls in a syntax TokenRouter does not know"
    )
    return (f"tools: the model's chat template {which}; the tool-call syntaxes parsed are {known}. Pass "
            'tool_choice "none" to get the answer as plain text')  # fmt: skip


def whole_call(payload: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a payload that is a whole call's JSON in any key order, or None."""
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters"))  # required: `{"name": ...}` alone is any JSON answer
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (and is shorter than it)."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class JsonScan:
    """Where the JSON object at the start of a growing text ends, scanning each character once: `feed` the
    whole text so far (it only grows); `end` is the index after the object's closing brace once it came."""

    def __init__(self) -> None:
        self.pos = 0
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.end: int | None = None

    def feed(self, text: str, start: int = 0) -> int | None:
        """`text[start:]` is the growing text; returns `end` (relative to `start`)."""
        i = start + self.pos
        while self.end is None and i < len(text):
            self._char(text[i], i - start)
            i += 1
        self.pos = i - start
        return self.end

    def _char(self, ch: str, at: int) -> None:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            if self.depth <= 0:
                self.end = at + 1
