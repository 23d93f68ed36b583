"""The OpenAI-compatible request bodies (validated with pydantic) and the OpenAI-style error.

Types are strict: `"max_tokens": "5"` is a 400, not a silent conversion. Unknown fields are ignored (as vLLM
and SGLang do); known OpenAI fields that TokenRouter does not implement are rejected with a 400 that says so.
An error's `param` is the field's path written as OpenAI writes it: `messages[0].role`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError


class APIError(Exception):
    """An error returned to the client as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _default_type(status)
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _default_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "invalid_request_error",
        405: "invalid_request_error",
        408: "invalid_request_error",
        413: "invalid_request_error",
        415: "invalid_request_error",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingFields(_Strict):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension (vLLM/SGLang): 0 or -1 = off
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # extension
    ignore_eos: bool = False  # extension, for benchmarks
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    return_routing_trace: bool = False  # extension: which model wrote each token
    return_token_ids: bool = False  # extension: the generated token ids (a client that re-sends them exactly)
    return_tokens_as_token_ids: bool = False  # extension (vLLM): logprobs name tokens `token_id:N`
    return_route_inputs: bool = False  # extension: what each route decision read (routing.inputs)

    def check_common(self) -> None:
        for name, (lo, hi) in INT_RANGES.items():
            lo = 0 if name == "max_tokens" and getattr(self, "echo", False) is True else lo  # score only
            _check_range(getattr(self, name), name, lo, hi)
        if self.temperature is not None and not 0.0 <= self.temperature <= 100.0:
            raise APIError(
                400, f"temperature must be in [0, 100], got {self.temperature}", param="temperature"
            )
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise APIError(400, f"top_p must be in (0, 1], got {self.top_p}", param="top_p")
        _check_range(self.n, "n", 1, MAX_N)
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise APIError(400, f"{name} is not supported by TokenRouter", param=name)
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported by TokenRouter", param="logit_bias")
        self._check_stops()

    def _check_stops(self) -> None:
        for s in self.stop_strings():
            if not s:
                raise APIError(400, "stop strings must not be empty", param="stop")
        if len(self.stop_strings()) > 16:
            raise APIError(400, "at most 16 stop strings", param="stop")
        ids = self.stop_token_ids or ()
        if len(ids) > MAX_STOP_TOKEN_IDS:
            msg = f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids, got {len(ids)}"
            raise APIError(400, msg, param="stop_token_ids")
        for i, t in enumerate(ids):
            _check_range(t, f"stop_token_ids[{i}]", 0, _INT32_MAX)

    def logprob_count(self) -> int:
        """-1: no logprobs; k ≥ 0: each token's log-probability and the k most likely tokens'."""
        return -1

    def prompt_logprob_count(self) -> int:
        """-1: the prompt is not scored; k ≥ 0: each prompt token's log-probability and the k most likely's."""
        return -1

    def completion_limit(self) -> tuple[int | None, str]:
        """The completion length the client asked for (None: the endpoint's default) and the field it came from,
        for the errors that name it."""
        return self.max_tokens, "max_tokens"

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    response_format: dict | None = None  # as chat's (structured.py), an extension here as in vLLM and SGLang
    best_of: int | None = None
    suffix: str | None = None

    def check(self) -> None:
        self.check_common()
        _check_range(self.logprobs, "logprobs", 0, MAX_LOGPROBS)
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of is not supported by TokenRouter", param="best_of")
        if self.suffix:
            raise APIError(400, "suffix is not supported by TokenRouter", param="suffix")

    def logprob_count(self) -> int:
        return -1 if self.logprobs is None else self.logprobs

    def prompt_logprob_count(self) -> int:
        return self.logprob_count() if self.echo else -1


class TextPart(_Strict):
    type: Literal["text"]
    text: str


# The roles a chat message may have. `developer` is OpenAI's newer name for `system` and is rendered as one
# (chat templates know `system`); `tool` answers a tool call (OpenAI's older `function` role is not supported).
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
# what the server itself passes to the chat template (codec.py); chat_template_kwargs adds to these
TEMPLATE_VARIABLES = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"})
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict | None = None  # a JSON schema of the arguments (an object)
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class _FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: _FunctionName


class _CallFunction(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str = ""
    type: Literal["function"] = "function"
    function: _CallFunction

    def template(self) -> dict:
        """The call as chat templates read it: arguments as an object where the JSON text is one
        (transformers' convention, which Qwen's templates follow)."""
        try:
            args = json.loads(self.function.arguments)
        except ValueError:
            args = self.function.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.function.name, "arguments": args},
        }


class ChatMessage(_Strict):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls (tools.py)
    tool_call_id: str | None = None  # a tool message: the call it answers

    def check(self, where: str) -> None:
        """Raise a 400 naming `where` (e.g. `messages[0]`) for a message the chat template cannot render."""
        if self.role not in CHAT_ROLES:
            roles = ", ".join(repr(r) for r in CHAT_ROLES)
            raise APIError(
                400, f"{where}.role must be one of {roles}, got {self.role!r}", param=f"{where}.role"
            )
        if self.tool_calls and self.role != "assistant":
            msg = f"{where}.tool_calls: only an assistant message has tool calls"
            raise APIError(400, msg, param=f"{where}.tool_calls")
        if self.content is None and not self.tool_calls:
            # OpenAI allows an assistant message without content only when it has tool_calls
            msg = f"{where}.content is required (a string or a list of text parts)"
            raise APIError(400, msg, param=f"{where}.content")
        if isinstance(self.content, list) and not self.content:
            raise APIError(400, f"{where}.content must have at least one part", param=f"{where}.content")

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content or ())


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens; wins when both are given
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: dict | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # extension (vLLM, SGLang): e.g. enable_thinking
    echo: bool = False  # rejected: the prompt's logprobs are a completions feature here

    def check(self) -> None:
        self.check_common()
        if self.echo:
            raise APIError(400, "echo is supported on /v1/completions only", param="echo")
        _check_range(self.max_completion_tokens, "max_completion_tokens", *INT_RANGES["max_tokens"])
        if not self.messages:
            raise APIError(400, "messages must not be empty", param="messages")
        for i, msg in enumerate(self.messages):
            msg.check(f"messages[{i}]")
        _check_range(self.top_logprobs, "top_logprobs", 0, MAX_LOGPROBS)
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
        self._check_tool_names()
        reserved = sorted(set(self.chat_template_kwargs or {}) & TEMPLATE_VARIABLES)
        if reserved:
            raise APIError(
                400,
                f"chat_template_kwargs: {reserved[0]!r} is set by the server, not by the request",
                param="chat_template_kwargs",
            )

    def _check_tool_names(self) -> None:
        """Each tool's name is a valid function name, and no two are the same."""
        seen: set[str] = set()
        for i, t in enumerate(self.tools or ()):
            name, where = t.function.name, f"tools[{i}].function"
            if not _TOOL_NAME.fullmatch(name):
                msg = f"{where}.name must be 1 to 64 letters, digits, '_' or '-', got {name!r}"
                raise APIError(400, msg, param=f"{where}.name")
            if name in seen:
                raise APIError(400, f"{where}.name: two tools are named {name!r}", param=f"{where}.name")
            seen.add(name)

    def logprob_count(self) -> int:
        return (self.top_logprobs or 0) if self.logprobs else -1

    def completion_limit(self) -> tuple[int | None, str]:
        # As OpenAI (max_tokens is deprecated there in favour of max_completion_tokens) and vLLM.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def template_messages(self) -> list[dict]:
        return [
            {
                "role": "system" if m.role == "developer" else m.role,
                "content": m.text(),
                **({"name": m.name} if m.name else {}),
                **({"tool_calls": [c.template() for c in m.tool_calls]} if m.tool_calls else {}),
                **({"tool_call_id": m.tool_call_id} if m.tool_call_id else {}),
            }
            for m in self.messages
        ]

    def uses_tools(self) -> bool:
        """The request gives tools, or its conversation has tool calls or tool results."""
        return bool(self.tools) or any(m.tool_calls or m.role == "tool" for m in self.messages)


# What a subserver holds for each integer field (the route kernel's columns: top_k int32, the seed's 64-bit
# pattern; token ids and lengths well inside int32). A value outside is a 400 naming the field and the range,
# never a request that reaches a subserver.
_INT32_MAX = 2**31 - 1
INT_RANGES: dict[str, tuple[int, int]] = {
    "max_tokens": (1, _INT32_MAX),
    "top_k": (-1, _INT32_MAX),  # -1 and 0: off
    "seed": (-(2**63), 2**64 - 1),  # int64 or uint64, kept as its 64-bit pattern
}
MAX_STOP_TOKEN_IDS = 1024  # each is compared with every generated token
MAX_N = 128  # choices per prompt, as OpenAI allows
MAX_LOGPROBS = 20  # most likely tokens per position (OpenAI's chat limit; vLLM's default)


def _check_range(value: int | None, name: str, lo: int, hi: int) -> None:
    if value is not None and not lo <= value <= hi:
        shown = value if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
        raise APIError(400, f"{name} must be in [{lo}, {hi}], got {shown}", param=name)


def parse_body(model: type[_Strict], body: bytes) -> Any:
    """Validate a raw JSON body, turning every problem into a 400 APIError."""
    if not body.strip():
        raise APIError(400, "the request body is empty; expected a JSON object")
    try:
        req = model.model_validate_json(body)
    except ValidationError as e:
        # The deepest error: for a value that fits no branch of a union, the branch that got furthest into it
        # (content given as a list of parts: the list's error, not "Input should be a valid string").
        err = max(e.errors(include_url=False), key=lambda x: len(x["loc"]))
        if err["type"] == "json_invalid":
            raise APIError(400, f"malformed JSON in the request body: {err['msg']}") from None
        if err["type"] in ("model_type", "model_attributes_type") and not err["loc"]:
            raise APIError(400, "the request body must be a JSON object") from None
        loc = _param_path(err["loc"])
        msg = err["msg"]
        if err["type"] == "literal_error" and "list[TextPart]" in err["loc"]:
            msg = f"only text parts are supported (type 'text'), got {err['input']!r}"
        raise APIError(400, f"{loc or 'body'}: {msg}", param=loc or None) from None
    req.check()
    return req


def _param_path(loc: tuple) -> str:
    """A pydantic location as OpenAI names a parameter: ("messages", 0, "role") -> "messages[0].role"."""
    out = ""
    for x in loc:
        if isinstance(x, int):
            out += f"[{x}]"
        elif not _is_union_tag(x):
            out += f".{x}" if out else str(x)
    return out


def _is_union_tag(x: Any) -> bool:
    # pydantic names union branches in locations ("str", "list[int]", ...); the client only needs the field.
    return isinstance(x, str) and (x in ("str", "int", "float", "bool") or "[" in x)


__all__ = ["APIError", "ChatCompletionRequest", "ChatMessage", "CompletionRequest", "parse_body"]
