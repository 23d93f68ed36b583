"""A byte-level BPE tokenizer for the demo models, saved HF-style (tokenizer.json + tokenizer_config.json)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"  # also the BOS: every document starts with it and ends with it
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOS, IM_START, IM_END)  # ids 0, 1, 2

# ChatML, as Qwen uses. The demo models are trained on code only, so chat turns are just context to them.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(slots=True)
class TokenizerConfig:
    vocab_size: int = 4096
    min_frequency: int = 2
    model_max_length: int = 1024

    def __post_init__(self) -> None:
        if not 300 <= self.vocab_size <= 65535:
            raise ValueError(
                f"vocab_size must be in [300, 65535] (byte alphabet + specials; ids fit uint16), got {self.vocab_size}"
            )
        if self.min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {self.min_frequency}")


def train_tokenizer(texts: Iterable[str], cfg: TokenizerConfig | None = None) -> Tokenizer:
    cfg = cfg or TokenizerConfig()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def save_tokenizer(tok: Tokenizer, folder: Path, model_max_length: int = 1024) -> None:
    """Write tokenizer.json and tokenizer_config.json (eos/bos/pad and a ChatML template) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): _added_token(t) for t in SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "model_max_length": model_max_length,
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _added_token(content: str) -> dict:
    """tokenizer_config.json's record of a special token."""
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


def load_tokenizer(folder: Path) -> Tokenizer:
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"no tokenizer.json in {folder}")
    return Tokenizer.from_file(str(path))


def encode_document(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of one document as the models were trained on it: EOS, the text, EOS."""
    eos = tok.token_to_id(EOS)
    if eos is None:
        raise ValueError(f"the tokenizer has no {EOS} token (teacher forcing needs the demo tokenizer's EOS)")
    return [eos, *tok.encode(text, add_special_tokens=False).ids, eos]
