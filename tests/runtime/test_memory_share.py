"""`serve`'s memory sizing (runtime/memory_share.py) on CPU: the shares a plan's models get of a GPU of a given
size where the plan leaves out `mem`, the plan that cannot fit, the shares the plan gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenrouter.runtime.engine.config import load_model_config
from tokenrouter.runtime.engine.make_model import config_dict, shape_for
from tokenrouter.runtime.memory_share import (
    GIB,
    MemoryFitError,
    model_need,
    safetensors_elements,
    share_memory,
    size_plan,
)
from tokenrouter.runtime.subserver.loading import MEM_HEADROOM

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "models" / "tiny-small"


def _folder(tmp_path: Path, shape: str) -> str:
    folder = tmp_path / shape
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config_dict(shape_for(shape))))
    return str(folder)


def _plan(tmp_path: Path, concurrency: int = 8, **models: dict) -> dict:
    """A plan's `models` and `serve` sections: NAME={"shape": ..., option: value, ...}."""
    out = {}
    for name, opts in models.items():
        opts = dict(opts)
        path = _folder(tmp_path, opts.pop("shape"))
        out[name] = {"path": path, "gpus": [0], "mem": None, "dtype": "bfloat16", "max_len": None, **opts}
    return {"models": out, "serve": {"concurrency": concurrency}}


def _needs(plan: dict) -> dict:
    return {x: model_need(spec) for x, spec in plan["models"].items()}


def test_two_models_fit_with_room(tmp_path):
    plan = _plan(
        tmp_path, slm={"shape": "qwen3-0.6b", "max_len": 4096}, llm={"shape": "qwen3-8b", "max_len": 4096}
    )
    needs = _needs(plan)
    cfg = load_model_config(plan["models"]["llm"]["path"])
    assert needs["llm"].weight_bytes == cfg.num_params() * 2  # no weights file: the config's count, bf16
    assert needs["llm"].kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    total = 80 * GIB
    shares = share_memory(needs, 8, {0: total})
    usable = total * MEM_HEADROOM
    assert sum(s.mem for s in shares.values()) == pytest.approx(1.0)
    for s in shares.values():
        assert not s.given and s.need_tokens == 8 * 4096
        assert s.weight_bytes + s.kv_bytes == pytest.approx(
            s.mem * usable, abs=2
        )  # what loading.py gives back
        assert s.kv_tokens > 8 * 4096  # room: more than the plan's concurrency × max_len
    # the KV split by need: both models hold the same number of tokens (to rounding), the 8B the larger share
    assert shares["slm"].kv_tokens == pytest.approx(shares["llm"].kv_tokens, rel=1e-6)
    assert shares["llm"].mem > shares["slm"].mem
    line = shares["llm"].line()
    assert "model llm: mem " in line and "of GPU 0 (80.00 GiB)" in line and "split by need" in line
    assert "× the 32,768 that 8 requests × max_len 4,096 need" in line


def test_a_plan_that_cannot_fit_names_the_numbers(tmp_path):
    plan = _plan(tmp_path, slm={"shape": "qwen3-0.6b"}, llm={"shape": "qwen3-32b"})
    with pytest.raises(MemoryFitError) as e:
        share_memory(_needs(plan), 8, {0: 40 * GIB})
    msg = str(e.value)
    assert msg.startswith("the plan does not fit GPU 0: of its 40.00 GiB, 36.00 GiB")
    weights = _needs(plan)["llm"].weight_bytes / GIB
    assert f"llm {weights:.2f} GiB" in msg and "max_len" in msg and "`mem`" in msg


def test_short_of_the_need_but_one_sequence_fits_says_so(tmp_path):
    # Qwen3's config allows 40,960 positions: 8 such sequences of the 8B do not fit 80 GB, one does
    plan = _plan(tmp_path, slm={"shape": "qwen3-0.6b"}, llm={"shape": "qwen3-8b"})
    shares = share_memory(_needs(plan), 8, {0: 80 * GIB})
    s = shares["llm"]
    assert s.need_tokens == 8 * load_model_config(plan["models"]["llm"]["path"]).max_position_embeddings
    assert s.kv_tokens < s.need_tokens and "requests may wait for KV" in s.line()


def test_given_mem_is_kept(tmp_path):
    plan = _plan(tmp_path, slm={"shape": "qwen3-0.6b", "max_len": 4096},
                 llm={"shape": "qwen3-8b", "max_len": 4096, "mem": 0.6})  # fmt: skip
    lines = []
    sized = size_plan(plan, ["slm", "llm"], totals=lambda: {0: 80 * GIB}, say=lines.append)
    assert sized["models"]["llm"]["mem"] == 0.6
    assert 0 < sized["models"]["slm"]["mem"] <= 0.4
    assert sized["models"]["slm"]["mem"] == pytest.approx(0.4, abs=1e-6)
    assert plan["models"]["slm"]["mem"] is None  # the plan given is left as it was
    assert len(lines) == 2 and "as the plan gives" in lines[1] and "split by need" in lines[0]
    # every mem given, or no GPU: nothing to do
    plan["models"]["slm"]["mem"] = 0.2
    assert size_plan(plan, ["slm", "llm"], totals=lambda: {0: 80 * GIB}) is None
    plan["models"]["slm"]["mem"] = None
    assert size_plan(plan, ["slm", "llm"], totals=lambda: None) is None
    # given shares that leave too little for the others
    plan["models"]["llm"]["mem"] = 0.999
    with pytest.raises(MemoryFitError, match="less 0.999 given as `mem` to other models"):
        size_plan(plan, ["slm", "llm"], totals=lambda: {0: 80 * GIB})


def test_models_on_two_gpus_are_sized_apart(tmp_path):
    plan = _plan(tmp_path, slm={"shape": "qwen3-0.6b", "max_len": 4096},
                 llm={"shape": "qwen3-8b", "max_len": 4096, "gpus": [1]})  # fmt: skip
    shares = share_memory(_needs(plan), 8, {0: 80 * GIB, 1: 80 * GIB})
    assert shares["slm"].mem == pytest.approx(1.0) and shares["llm"].mem == pytest.approx(1.0)
    with pytest.raises(MemoryFitError, match="GPU 1: no memory total"):
        share_memory(_needs(plan), 8, {0: 80 * GIB})


def test_weights_counted_from_the_safetensors_header():
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(TINY / "model.safetensors"))
    assert safetensors_elements(TINY) == sum(t.numel() for t in tensors.values())
    spec = {"path": str(TINY), "gpus": [0], "mem": None, "dtype": "bfloat16", "max_len": None}
    assert (
        model_need(spec).weight_bytes
        == safetensors_elements(TINY) * torch.empty((), dtype=torch.bfloat16).element_size()
    )
    assert model_need({**spec, "dtype": "float32", "max_len": 100}).max_len == 100


def test_a_broken_weights_file_is_a_clear_error(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x05\x00")
    with pytest.raises(MemoryFitError, match="not a readable safetensors file"):
        safetensors_elements(tmp_path)


def test_serve_writes_the_sized_plan_and_says_why(tmp_path, capsys):
    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.compiler.plan import read_plan
    from tokenrouter.runtime.memory_share import serve_sizing

    plan = compile_file(ROOT / "examples" / "bernoulli.tr", {}).plan
    got, path = serve_sizing(plan, "unused.plan", tmp_path, list(plan["models"]), totals=lambda: {0: GIB})
    assert path == str(tmp_path / "plan-sized.json")
    back = read_plan(path)  # as the subservers read it: the shares pass the plan's checks
    assert [back["models"][x]["mem"] for x in plan["models"]] == [
        got["models"][x]["mem"] for x in plan["models"]
    ]
    assert sum(back["models"][x]["mem"] for x in plan["models"]) <= 1.0
    err = capsys.readouterr().err.splitlines()
    assert [x.split(":")[1] for x in err] == [f" model {x}" for x in plan["models"]]
    # on CPU (no GPU here) the plan is served as it is
    assert serve_sizing(plan, "p.plan", tmp_path, list(plan["models"]), totals=lambda: None) == (
        plan,
        "p.plan",
    )
