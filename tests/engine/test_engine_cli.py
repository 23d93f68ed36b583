"""`tokenrouter make-model` and `tokenrouter generate` through the typer app (in-process)."""

import json
from pathlib import Path

from typer.testing import CliRunner

from tokenrouter.cli import app

TINY_SMALL = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-small"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_make_model_tiny_is_deterministic_and_loadable(tmp_path):
    a = invoke("make-model", tmp_path / "a", "--shape", "tiny", "--seed", 3)
    b = invoke("make-model", tmp_path / "b", "--shape", "tiny", "--seed", 3)
    assert a.exit_code == 0 and b.exit_code == 0, a.output
    assert "model.safetensors" in a.output
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    tok_cfg = json.loads((tmp_path / "a" / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"]
    out = invoke("generate", tmp_path / "a", "--prompt-ids", "1,2,3", "--max-tokens", 4, "--json")
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.output)["token_ids"]) <= 4


def test_make_model_large_shape_writes_no_weights(tmp_path):
    out = invoke("make-model", tmp_path / "q", "--shape", "qwen3-0.6b")
    assert out.exit_code == 0, out.output
    assert "no weights" in out.output and "596" in out.output  # 596M parameters (tied embeddings)
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["num_hidden_layers"], cfg["hidden_size"]) == (151936, 28, 1024)
    assert not list((tmp_path / "q").glob("*.safetensors"))


def test_make_model_overrides_and_errors(tmp_path):
    out = invoke("make-model", tmp_path / "l", "--arch", "llama", "--layers", 3, "--hidden", 32, "--heads", 2,
                 "--kv-heads", 1, "--no-tie")  # fmt: skip
    assert out.exit_code == 0, out.output
    cfg = json.loads((tmp_path / "l" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 3
    assert not cfg["tie_word_embeddings"]
    assert invoke("make-model", tmp_path / "l").exit_code == 1  # not empty, no --force
    assert invoke("make-model", tmp_path / "l", "--force").exit_code == 0
    bad = invoke("make-model", tmp_path / "x", "--shape", "huge")
    assert bad.exit_code == 2 and "unknown shape" in bad.output
    bad = invoke("make-model", tmp_path / "x", "--heads", 3, "--kv-heads", 2)
    assert bad.exit_code == 2 and "multiple" in bad.output


def test_generate_greedy_text_and_json_agree():
    as_json = invoke(
        "generate", TINY_SMALL, "--prompt", "Hello there", "--max-tokens", 8, "--ignore-eos", "--json"
    )
    assert as_json.exit_code == 0, as_json.output
    result = json.loads(as_json.output)
    assert len(result["token_ids"]) == 8 and result["finish_reason"] == "length"
    assert result["prompt_token_ids"]
    as_text = invoke("generate", TINY_SMALL, "--prompt", "Hello there", "--max-tokens", 8, "--ignore-eos")
    assert as_text.exit_code == 0 and as_text.output.rstrip("\n") == result["text"]
    again = invoke("generate", TINY_SMALL, "--prompt-ids", ",".join(map(str, result["prompt_token_ids"])),
                   "--max-tokens", 8, "--ignore-eos", "--json")  # fmt: skip
    assert json.loads(again.output)["token_ids"] == result["token_ids"]


def test_generate_sampling_is_seeded():
    def run(seed):
        out = invoke("generate", TINY_SMALL, "--prompt-ids", "5,6,7", "--max-tokens", 12, "--ignore-eos",
                     "--temperature", 1.0, "--top-k", 50, "--seed", seed, "--json")  # fmt: skip
        assert out.exit_code == 0, out.output
        return json.loads(out.output)["token_ids"]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_generate_user_errors(tmp_path):
    cases = [
        ((tmp_path / "missing", "--prompt", "x"), 2, "no such model folder"),
        ((TINY_SMALL,), 2, "exactly one of"),
        ((TINY_SMALL, "--prompt", "x", "--prompt-ids", "1"), 2, "exactly one of"),
        ((TINY_SMALL, "--prompt-ids", "1,a"), 2, "comma-separated"),
        ((TINY_SMALL, "--prompt-ids", "1", "--top-p", 0), 2, "top_p"),
        ((TINY_SMALL, "--prompt-ids", "1,9999"), 1, "out of range"),
        ((tmp_path, "--prompt", "x"), 1, "no config.json"),
    ]
    for args, code, word in cases:
        out = invoke("generate", *args)
        assert out.exit_code == code, (args, out.output)
        assert word in out.output, (args, out.output)
        assert "Traceback" not in out.output


def test_tiny_tokenizer_loads_in_transformers_with_chat_template():
    transformers = __import__("pytest").importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(TINY_SMALL))
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok("The small model writes")["input_ids"]
    assert tok.decode(ids) == "The small model writes" and max(ids) < 512


def test_committed_example_models_are_what_make_model_writes(tmp_path):
    from tokenrouter.runtime.engine.make_model import EXAMPLE_MODELS

    for name, (overrides, seed) in EXAMPLE_MODELS.items():
        args = ["make-model", tmp_path / name, "--shape", "tiny", "--seed", seed]
        for key, value in overrides.items():
            args += [f"--{key.replace('_', '-')}", value]
        assert invoke(*args).exit_code == 0
        committed = TINY_SMALL.parent / name
        for f in sorted(committed.iterdir()):
            assert f.read_bytes() == (tmp_path / name / f.name).read_bytes(), f


def test_generate_chat_uses_the_template_like_transformers():
    transformers = __import__("pytest").importorskip("transformers")
    out = invoke("generate", TINY_SMALL, "--prompt", "hi there", "--chat", "--max-tokens", 2, "--json")
    assert out.exit_code == 0, out.output
    tok = transformers.AutoTokenizer.from_pretrained(str(TINY_SMALL))
    want = tok.apply_chat_template(
        [{"role": "user", "content": "hi there"}], tokenize=True, add_generation_prompt=True
    )
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert json.loads(out.output)["prompt_token_ids"] == list(want)
    bad = invoke("generate", TINY_SMALL, "--prompt-ids", "1", "--chat")
    assert bad.exit_code == 2 and "--chat needs --prompt" in bad.output
