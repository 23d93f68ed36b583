import json

import pytest

from tokenrouter.training.corpus import (
    SplitConfig,
    find_sources,
    module_unit,
    part_of,
    split_sources,
    stdlib_dir,
)
from tokenrouter.training.tokenizer import (
    EOS,
    encode_document,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)


def test_units():
    assert module_unit("email.mime.text") == "email"
    assert module_unit("os") == "os"
    assert module_unit("test.test_asyncio.test_tasks") == "test.test_asyncio"
    assert module_unit("test") == "test"


def test_split_of_the_real_stdlib_never_mixes_units():
    parts = split_sources(find_sources(stdlib_dir()))
    units = {p: {s.unit for s in files} for p, files in parts.items()}
    assert units["train"] and units["router"] and units["eval"]
    assert not units["train"] & units["router"]
    assert not units["train"] & units["eval"]
    assert not units["router"] & units["eval"]
    # every module of a package lands where its unit does
    for p, files in parts.items():
        for s in files:
            assert part_of(s.module) == p == part_of(s.unit)


def test_split_shares_follow_the_config():
    mods = [f"m{i}" for i in range(2000)]
    counts = {p: sum(part_of(m) == p for m in mods) for p in ("train", "router", "eval")}
    assert 1450 < counts["train"] < 1750 and 120 < counts["router"] < 280 and 120 < counts["eval"] < 280
    assert all(part_of(m, SplitConfig(100, 0, 0)) == "train" for m in mods[:50])
    with pytest.raises(ValueError, match="must be 100"):
        SplitConfig(50, 10, 10)


def test_prepared_corpus(tiny_corpus):
    manifest = json.loads((tiny_corpus / "manifest.json").read_text())
    exported = {p.stem for p in (tiny_corpus / "eval").iterdir()} | {
        p.stem for p in (tiny_corpus / "router").iterdir()
    }
    for module in exported:
        assert manifest["parts"][module] in ("router", "eval")
    import numpy as np

    ids = np.load(tiny_corpus / "train.npy")
    assert ids.dtype == np.uint16 and ids.size > 1000 and int(ids.max()) < manifest["vocab_size"]
    assert ids[0] == 0 and ids[-1] == 0  # documents are wrapped in EOS (id 0)


TEXTS = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n", "import os\nprint(os.getcwd())\n"] * 20


@pytest.mark.parametrize(
    "text", ["", "x = 1", "    indented\n\ttabs\n", "ünïcödé ☃ 日本語 \x00 \r\n", "def g():\n    '''doc'''\n"]
)
def test_tokenizer_round_trip(tmp_path, text):
    tok = train_tokenizer(TEXTS)
    save_tokenizer(tok, tmp_path)
    tok2 = load_tokenizer(tmp_path)
    ids = tok2.encode(text, add_special_tokens=False).ids
    assert tok2.decode(ids, skip_special_tokens=False) == text
    doc = encode_document(tok2, text)
    assert doc[0] == doc[-1] == tok2.token_to_id(EOS) == 0


def test_tokenizer_config(tmp_path):
    save_tokenizer(train_tokenizer(TEXTS), tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == cfg["bos_token"] == EOS
    assert "<|im_start|>" in cfg["chat_template"]
    from jinja2 import Template

    text = Template(cfg["chat_template"]).render(messages=[{"role": "user", "content": "hi"}],
                                                 add_generation_prompt=True)  # fmt: skip
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
