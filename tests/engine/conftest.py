import json
from pathlib import Path

import pytest

from tokenrouter.runtime.engine.make_model import make_model, shape_for

REPO = Path(__file__).resolve().parents[2]
TINY_SMALL = REPO / "examples" / "models" / "tiny-small"
TINY_LARGE = REPO / "examples" / "models" / "tiny-large"

VARIANTS = {
    "qwen3": dict(arch="qwen3"),
    "qwen2": dict(arch="qwen2", tie=False),  # q/k/v biases, untied lm_head
    "llama": dict(arch="llama", heads=4, kv_heads=4),
    "llama3-rope": dict(arch="llama", layers=1),  # + llama3 rope scaling written below
    "mistral": dict(arch="llama", heads=4, kv_heads=2, head_dim=32),  # written as MistralForCausalLM below
}


def build_variant(root: Path, name: str) -> Path:
    out = root / name
    make_model(out, shape_for("tiny", **VARIANTS[name]), seed=7)
    if name == "llama3-rope":
        cfg = json.loads((out / "config.json").read_text())
        cfg["rope_theta"] = 10000.0
        cfg["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        (out / "config.json").write_text(json.dumps(cfg))
    if name == "mistral":  # Mistral Nemo's way: a head_dim that is not hidden / heads, no sliding window
        cfg = json.loads((out / "config.json").read_text())
        cfg.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None)
        (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {name: build_variant(root, name) for name in VARIANTS}


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # tiny models: intra-op threads only add contention on the shared 2-core CI machine
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
