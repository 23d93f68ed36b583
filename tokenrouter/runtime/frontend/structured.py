"""Structured output: a request's `response_format` or forced tool call as the grammar its completion follows.

`response_format` `{"type": "json_object"}` is any JSON object; `{"type": "json_schema", "json_schema": {"name",
"schema"}}` JSON text valid against the schema; `{"type": "text"}` (or none) leaves the output free. With `tools`,
`tool_choice` "required" or a named function constrains the output to the chat template's tool-call syntax
(`tool_syntax.py`: Hermes / Qwen `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, Llama 3
`{"name": ..., "parameters": ...}`) with the arguments valid against that function's `parameters`. The grammar
is checked here, with the entry model's tokenizer, so that a schema llguidance cannot compile is a 400 naming
the field; the subservers apply it (runtime/grammar.py).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from tokenrouter.runtime import grammar as g
from tokenrouter.runtime.frontend.protocol import APIError
from tokenrouter.runtime.frontend.tools import ToolPlan

# what the chat templates render a call's JSON with (`tojson`): the constrained output looks the same
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class Constraints:
    """The entry model's side of structured output: its tokenizer (loaded on the first constrained request)
    and the grammars requests ask for."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = str(model_dir)

    def grammar(self, req: Any, tools: ToolPlan | None) -> str:
        """The request's grammar ("" for none); an APIError 400 for a format or schema that cannot be one.
        Every tool's parameters are checked, also where the output is left free."""
        fmt = getattr(req, "response_format", None)
        kind = fmt_type(fmt)
        if tools is not None:
            for i, fn in enumerate(tools.functions):
                param = f"tools[{i}].function.parameters"
                self._check(_json_grammar(fn.parameters or {"type": "object"}, param), param)
        if tools is not None and tools.forced:
            if kind != "text":
                msg = f"response_format {kind!r} cannot be combined with tool_choice {tools.choice_text()!r}"
                raise APIError(400, msg + ": both constrain the output", param="response_format")
            return self._check(tool_grammar(tools), "tools")
        if kind == "text":
            return ""
        if kind == "json_object":
            return self._check(_json_grammar({"type": "object"}, "response_format"), "response_format")
        param = "response_format.json_schema.schema"
        return self._check(_json_grammar(_json_schema(fmt), param), param)

    def _check(self, grammar: str, param: str) -> str:
        err = _grammar_error(self.model_dir, grammar)
        if err:
            raise APIError(400, f"{param}: the schema cannot constrain the output: {err}", param=param)
        return grammar


@functools.lru_cache(maxsize=256)
def _grammar_error(model_dir: str, grammar: str) -> str | None:
    return g.grammar_error(grammar, g.load_tokenizer(model_dir))


def fmt_type(fmt: Any) -> str:
    """The response_format's type ("text" when absent); a 400 for one that is not supported."""
    if fmt is None:
        return "text"
    kind = fmt.get("type")
    if kind in ("text", "json_object", "json_schema"):
        return kind
    raise APIError(400, f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                   param="response_format.type")  # fmt: skip


def _json_grammar(schema: dict, param: str) -> str:
    """JSON text valid against `schema`, written as the chat templates write JSON (JSON_OPTIONS; a schema's
    own `x-guidance` options win)."""
    try:
        return g.from_json_schema(
            {**schema, "x-guidance": {**JSON_OPTIONS, **(schema.get("x-guidance") or {})}}
        )
    except (ValueError, TypeError) as e:
        raise APIError(400, f"{param}: the schema is not valid: {e}", param=param) from None


def tool_grammar(tools: ToolPlan) -> str:
    """Lark: one tool call (or, with parallel_tool_calls, one or more, the syntax's separator apart) of the
    functions `tools.allowed()` in the model's call syntax: Hermes
    `<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`, Llama 3 `{"name": NAME, "parameters":
    ARGS}`, Mistral `[{"name": NAME, "arguments": ARGS}, ...]`, ARGS valid against the function's parameters."""
    syntax = tools.syntax
    rules = []
    for i, fn in enumerate(tools.allowed()):
        params = dict(fn.parameters) if fn.parameters is not None else {"type": "object"}
        # the definitions go to the root, where the parameters' `#/$defs/...` references now point
        defs = {k: params.pop(k) for k in ("$defs", "definitions") if k in params}
        schema = {
            "type": "object",
            "properties": {"name": {"const": fn.name}, syntax.args_key: params},
            "required": ["name", syntax.args_key],
            "additionalProperties": False,
            "x-guidance": JSON_OPTIONS,
            **defs,
        }
        rules.append(f"fn{i}: %json {json.dumps(schema)}")
    names = " | ".join(f"fn{i}" for i in range(len(rules)))
    calls = f"call ({json.dumps(syntax.separator)} call)*" if tools.parallel else "call"
    start = [*_literal(syntax.list_open), calls, *_literal(syntax.list_close)]
    call = [*_literal(syntax.call_open), f"({names})", *_literal(syntax.call_close)]
    return g.from_lark("\n".join(["start: " + " ".join(start), "call: " + " ".join(call), *rules]) + "\n")


def _literal(text: str) -> list[str]:
    """A Lark string literal of `text`, as the one item of a list, or no item where `text` is empty."""
    return [json.dumps(text)] if text else []


def _json_schema(fmt: dict) -> dict:
    """A `json_schema` response format's schema; an APIError 400 where the format is not of that shape."""
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        msg = "response_format.json_schema must be an object with a 'schema' object"
        raise APIError(400, msg, param="response_format.json_schema")
    if not isinstance(spec.get("name", ""), str):
        msg = "response_format.json_schema.name must be a string"
        raise APIError(400, msg, param="response_format.json_schema.name")
    return spec.get("schema", {})
