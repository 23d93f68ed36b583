import json

import torch

from tokenrouter.training.lm import SHAPES


def test_shapes_are_in_range():
    assert 1_000_000 <= SHAPES["small"].n_params() <= 2_000_000
    assert 10_000_000 <= SHAPES["large"].n_params() <= 15_000_000
    # the candidate small model: the small range, deeper than py-small, same width and vocabulary
    deep, small = SHAPES["small-deep"], SHAPES["small"]
    assert small.n_params() < deep.n_params() <= 2_000_000
    assert deep.num_hidden_layers > small.num_hidden_layers and deep.hidden_size == small.hidden_size
    wide = SHAPES["small-wide"]
    assert small.n_params() < wide.n_params() <= 2_000_000 and wide.hidden_size > small.hidden_size
    assert wide.num_attention_heads * wide.head_dim == wide.hidden_size
    assert wide.vocab_size == small.vocab_size


def test_train_models_takes_the_candidate_and_names_bad_models(tiny_corpus, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "train_models.py"
    base = [
        sys.executable,
        str(script),
        "--data",
        str(tiny_corpus),
        "--out",
        str(tmp_path),
        "--tiny",
        "--device",
        "cpu",
    ]
    proc = subprocess.run(
        [*base, "--models", "small-deep,small-wide"], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((tmp_path / "py-small-deep" / "config.json").read_text())
    assert config["num_hidden_layers"] == SHAPES["tiny-small-deep"].num_hidden_layers
    config = json.loads((tmp_path / "py-small-wide" / "config.json").read_text())
    assert config["hidden_size"] == SHAPES["tiny-small-wide"].hidden_size
    proc = subprocess.run([*base, "--models", "medium"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "small-deep" in proc.stderr and "Traceback" not in proc.stderr


def test_tiny_training_writes_loadable_hf_folders(tiny_pair):
    from tokenrouter.runtime.engine.embedded import load_engine

    for name in ("py-small", "py-large"):
        folder = tiny_pair / name
        meta = json.loads((folder / "training.json").read_text())
        curve = json.loads((tiny_pair / f"{name}.curve.json").read_text())["curve"]
        assert [p["step"] for p in curve] == [6, 12]
        assert (
            curve[-1]["train_loss"] < 7.0
        )  # from ln(400) ≈ 6.0 at init on a 400-token vocabulary: it learns
        assert meta["best_val_loss"] == min(p["val_loss"] for p in curve)
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == "qwen3" and config["torch_dtype"] == "float16"
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
            assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float16
        assert "lm_head.weight" not in keys and "model.layers.0.self_attn.q_norm.weight" in keys
        engine = load_engine(folder, device="cpu", max_tokens=64)
        logits, hidden = engine.forward_full([0, 5, 7, 9])
        assert logits.shape == (4, 400) and hidden.shape == (4, config["hidden_size"])
        assert torch.isfinite(logits).all()


def test_tiny_folder_matches_transformers(tiny_pair):
    from transformers import Qwen3ForCausalLM

    from tokenrouter.runtime.engine.embedded import load_engine

    folder = tiny_pair / "py-large"
    ids = torch.tensor([0, 11, 42, 7, 99, 3])
    hf = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(input_ids=ids[None]).logits[0]
    ours, _ = load_engine(folder, device="cpu", dtype="float32", max_tokens=64).forward_full(ids)
    torch.testing.assert_close(ours.float(), ref, atol=1e-4, rtol=1e-4)


def test_distilled_recipe_learns_from_the_teacher_and_names_a_bad_one(tiny_corpus, tiny_pair, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "train_models.py"
    base = [sys.executable, str(script), "--data", str(tiny_corpus), "--out", str(tmp_path), "--tiny"]
    base += ["--device", "cpu", "--models", "small-kd"]
    proc = subprocess.run(
        [*base, "--teacher", str(tiny_pair / "py-large")], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    curve = json.loads((tmp_path / "py-small-kd.curve.json").read_text())
    agree = [p["agree_with_teacher"] for p in curve["curve"]]
    assert all(0.0 <= a <= 1.0 for a in agree)
    assert curve["meta"]["teacher"] == str(tiny_pair / "py-large")
    assert curve["meta"]["best_agree_with_teacher"] in agree
    config = json.loads((tmp_path / "py-small-kd" / "config.json").read_text())
    assert config["hidden_size"] == SHAPES["tiny-small"].hidden_size
    # a missing teacher and one of another vocabulary are named, without a traceback
    proc = subprocess.run(
        [*base, "--teacher", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "nope" in proc.stderr and "Traceback" not in proc.stderr
    big = Path(__file__).resolve().parents[2] / "examples" / "models" / "py-large"
    proc = subprocess.run([*base, "--teacher", str(big)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "vocabulary 4096" in proc.stderr and "Traceback" not in proc.stderr


def test_meta_records_a_teacher_inside_the_repository_relative_to_it():
    """The shipped folders' training.json must not carry the training machine's directories."""
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("train_models_script", root / "bench" / "train_models.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    assert mod._shown(root / "examples" / "models" / "py-large") == "examples/models/py-large"
    assert mod._shown(Path("/elsewhere/py-large")) == "/elsewhere/py-large"
    shipped = json.loads((root / "examples" / "models" / "py-small-kd" / "training.json").read_text())
    assert shipped["teacher"] == "examples/models/py-large"
