"""Text ↔ token ids for the frontend: the entry model's tokenizer, its chat template, incremental detokenizing.

Only `tokenizers` and jinja2 are used (no transformers): `tokenizer.json` for encode/decode,
`tokenizer_config.json` for the special tokens the template may reference, and the chat template where
transformers keeps it (`read_chat_template`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class TemplateError(ValueError):
    """The chat template rejected the conversation (its raise_exception), or it failed to render."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:  # fmt: skip
    # transformers' `tojson` (chat templates are written for it): plain JSON, not jinja's HTML-escaped one
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json stores special tokens either as a string or as {"content": ...}.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


NO_TEMPLATE = "no chat template (neither chat_template.jinja nor a chat_template in tokenizer_config.json)"


def read_chat_template(model_dir: Path, config: dict) -> str | None:
    """The folder's default chat template, read as transformers reads it: `chat_template.jinja` (what
    `save_pretrained` writes since transformers 5) before tokenizer_config.json's `chat_template`, which is a
    string or a list of named templates (`[{"name": "default", "template": ...}, ...]`) whose "default" is
    used. None where there is none."""
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


class TextCodec:
    """Tokenizer, chat template and special tokens of one model folder."""

    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        tok_file = model_dir / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in model folder {model_dir}")
        self.tokenizer = Tokenizer.from_file(str(tok_file))
        cfg_file = model_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        eos_id = self.tokenizer.token_to_id(self.eos_token) if self.eos_token else None
        self.eos_token_ids: tuple[int, ...] = () if eos_id is None else (eos_id,)
        template = read_chat_template(model_dir, cfg)
        self.template_source: str | None = template if isinstance(template, str) else None
        self._template = None
        self.template_variables: frozenset[str] = frozenset()  # the variables the template reads
        if isinstance(template, str):
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_exception
            env.filters["tojson"] = _tojson
            try:
                self._template = env.from_string(template)
                self.template_variables = frozenset(meta.find_undeclared_variables(env.parse(template)))
            except jinja2.TemplateSyntaxError as e:
                raise TemplateError(f"the chat template does not parse: {e}") from e

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    @property
    def supports_tools(self) -> bool:
        """The chat template renders tools (it reads a `tools` variable, as Qwen's and Hermes' do)."""
        return "tools" in self.template_variables

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.encode_many([text], add_special_tokens)[0]

    def encode_many(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each text. Through the batch API, which releases the GIL while it runs (`encode` holds
        it: 1.1 s for 2 MB of text, during which no other thread ran) and, as `encode_batch_fast`
        (tokenizers >= 0.21), skips the character offsets (0.37 s for the same text). Callers on the event
        loop run this in a worker thread (handlers.py)."""
        batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return [e.ids for e in batch(texts, add_special_tokens=add_special_tokens)]

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """The chat template rendered for `messages`; `extra` are further template variables (a request's
        `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`)."""
        if self._template is None:
            raise TemplateError(f"the model has {NO_TEMPLATE}")
        try:
            return self._template.render(
                **extra,
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"the chat template failed: {e}") from e

    def encode_chat(self, messages: list[dict], **extra) -> list[int]:
        # Like HF's apply_chat_template(tokenize=True): the template writes the special tokens itself.
        return self.encode(self.apply_chat_template(messages, **extra), add_special_tokens=False)

    def decoder(self) -> Detokenizer:
        return Detokenizer(self.tokenizer)


class Detokenizer:
    """Incremental detokenizing of one generation: feed token ids one by one, get the new text; `flush()` at
    the end gives what is still held back, so that the pieces add up to `decode(all ids)`."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)
        self._ids: list[int] = []
        self._pieces: list[str] = []  # text returned so far

    def step(self, token_id: int) -> str:
        """The text this token completes ('' while a multi-byte character is still incomplete)."""
        self._ids.append(token_id)
        try:
            piece = self._stream.step(self._tokenizer, token_id) or ""
        except Exception:  # an id outside the tokenizer's vocabulary (a model with a padded vocab)
            piece = ""
        self._pieces.append(piece)
        return piece

    def flush(self) -> str:
        """The rest of `decode(all ids)` (e.g. U+FFFD for a trailing incomplete UTF-8 sequence), once."""
        full = self._tokenizer.decode(self._ids, skip_special_tokens=True)
        emitted = "".join(self._pieces)
        rest = full[len(emitted) :] if full.startswith(emitted) else ""
        self._pieces = [full] if rest else [emitted]
        return rest
