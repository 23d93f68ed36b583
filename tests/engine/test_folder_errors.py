"""A missing or malformed model folder gets an error that names the path and what is wrong."""

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tokenrouter.runtime.engine.config import ModelFolderError, load_model_config
from tokenrouter.runtime.engine.embedded import load_engine

TINY_SMALL = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-small"


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "m"
    shutil.copytree(TINY_SMALL, out)
    return out


def expect(path, *words, named=None):
    with pytest.raises(ModelFolderError) as info:
        load_engine(path)
    msg = str(info.value)
    assert str(named or path) in msg
    for w in words:
        assert w in msg
    return msg


def test_missing_folder(tmp_path):
    expect(tmp_path / "nothing-here", "does not exist")


def test_not_a_directory(tmp_path):
    f = tmp_path / "file.json"
    f.write_text("{}")
    expect(f, "not a directory")


def test_no_config(folder):
    (folder / "config.json").unlink()
    expect(folder, "no config.json")


def test_malformed_json_names_line_and_column(folder):
    (folder / "config.json").write_text('{\n  "hidden_size": 64,\n  oops\n}')
    msg = expect(folder, "malformed JSON")
    assert "config.json:3:3" in msg


def test_unsupported_architecture(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(cfg))
    expect(folder, "unsupported architecture", "GPT2LMHeadModel")


@pytest.mark.parametrize(
    "patch, words",
    [
        ({"hidden_act": "gelu"}, ("hidden_act", "gelu")),
        ({"use_sliding_window": True}, ("sliding-window",)),
        ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096}, ("sliding-window",)),  # 7B v0.1
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, ("rope type", "yarn")),
        ({"num_key_value_heads": 3}, ("multiple",)),
    ],
)
def test_unsupported_or_invalid_config(folder, patch, words):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(patch)
    (folder / "config.json").write_text(json.dumps(cfg))
    expect(folder, *words)


def test_missing_fields(folder):
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["hidden_size"], cfg["vocab_size"]
    (folder / "config.json").write_text(json.dumps(cfg))
    expect(folder, "missing field(s)", "hidden_size", "vocab_size")


def test_no_weights(folder):
    (folder / "model.safetensors").unlink()
    expect(folder, "no *.safetensors")
    assert load_engine(folder, load="dummy").info.vocab_size == 512  # dummy needs no file


def test_missing_and_misshapen_tensors(folder):
    sd = load_file(folder / "model.safetensors")
    missing = dict(sd)
    del missing["model.layers.1.self_attn.k_proj.weight"]
    save_file(missing, folder / "model.safetensors")
    expect(folder, "weights missing", "model.layers.1.self_attn.qkv_proj.weight")
    wrong = dict(sd)
    wrong["model.norm.weight"] = wrong["model.norm.weight"][:10]
    save_file(wrong, folder / "model.safetensors")
    expect(folder, "model.norm.weight", "shape", named=folder / "model.safetensors")


def test_sharded_weights_load_the_same(folder):
    sd = load_file(folder / "model.safetensors")
    names = sorted(sd)
    (folder / "model.safetensors").unlink()
    save_file({k: sd[k] for k in names[::2]}, folder / "model-00001-of-00002.safetensors")
    save_file({k: sd[k] for k in names[1::2]}, folder / "model-00002-of-00002.safetensors")
    a = load_engine(folder).forward_full([1, 2, 3])[0]
    b = load_engine(TINY_SMALL).forward_full([1, 2, 3])[0]
    assert (a == b).all()


def test_corrupt_safetensors(folder):
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    expect(folder, "cannot read safetensors", named=folder / "model.safetensors")


def test_config_fields():
    cfg = load_model_config(TINY_SMALL)
    assert (cfg.family, cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim) == ("qwen3", 64, 2, 16)
    assert cfg.qk_norm and cfg.tie_word_embeddings and not cfg.qkv_bias
    assert cfg.eos_token_ids == (2, 0)  # from generation_config.json
