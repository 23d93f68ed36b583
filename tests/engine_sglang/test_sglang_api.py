"""Every SGLang name `SGLangEngine` relies on exists, with the fields and parameters it uses, in the SGLang found here.

Reads SGLang's source files with `ast`: nothing of SGLang is imported or run, so this runs on any machine that
has the SGLang package files (a CPU box with the bundle unpacked on PYTHONPATH too) and catches a version bump
that renamed something before a GPU is involved. Skipped where SGLang is absent (CI).
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

import pytest

from tokenrouter.runtime.engine.config import load_model_config
from tokenrouter.runtime.engine.embedded import load_engine
from tokenrouter.runtime.engine.sglang_engine import SGLANG_VERSION, SGLangSettings, server_args_kwargs

REPO = Path(__file__).resolve().parents[2]
TINY_SMALL = REPO / "examples" / "models" / "tiny-small"


@pytest.fixture(scope="module")
def root() -> Path:
    spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("SGLang is not installed (docs/sglang.md)")
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _class(root: Path, rel: str, name: str) -> ast.ClassDef:
    for node in ast.walk(_tree(root / rel)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not in sglang/{rel}")


def members(root: Path, rel: str, name: str) -> set[str]:
    """Annotated fields, assigned names and methods of a class."""
    out: set[str] = set()
    for node in _class(root, rel, name).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
    return out


def params(root: Path, rel: str, cls: str, method: str) -> set[str]:
    for node in _class(root, rel, cls).body:
        if isinstance(node, ast.FunctionDef) and node.name == method:
            a = node.args
            return {x.arg for x in a.args + a.kwonlyargs}
    raise AssertionError(f"{cls}.{method} not in sglang/{rel}")


def top_level_names(root: Path, rel: str) -> set[str]:
    out: set[str] = set()
    for node in _tree(root / rel).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            out |= {a.asname or a.name for a in node.names}
    return out


def test_version_is_the_pinned_one(root):
    assert f"__version__ = version = '{SGLANG_VERSION}'" in (root / "_version.py").read_text()


def test_server_args_fields(root):
    fields = members(root, "srt/server_args.py", "ServerArgs")
    config = load_model_config(TINY_SMALL)
    for settings in (
        SGLangSettings(),
        SGLangSettings(max_tokens=100, max_len=64, mem_fraction_static=0.5, cuda_graph=False, load="dummy"),
    ):
        kw = server_args_kwargs(TINY_SMALL, settings, config, 0)
        assert set(kw) <= fields, set(kw) - fields


def test_runner_construction_names(root):
    assert {"model_config", "mem_fraction_static", "gpu_id", "ps", "nccl_port", "server_args"} <= params(
        root, "srt/model_executor/model_runner.py", "ModelRunner", "__init__"
    )
    runner = members(root, "srt/model_executor/model_runner.py", "ModelRunner")
    assert {"alloc_memory_pool", "init_attention_backends", "init_cuda_graphs", "forward"} <= runner
    assert {"logits_output", "can_run_graph"} <= members(
        root, "srt/model_executor/model_runner.py", "ModelRunnerOutput"
    )
    assert {"next_token_logits", "hidden_states"} <= members(
        root, "srt/layers/logits_processor.py", "LogitsProcessorOutput"
    )
    assert "trivial" in members(root, "srt/distributed/parallel_state_wrapper.py", "ParallelState")
    assert "from_server_args" in members(root, "srt/configs/model_config.py", "ModelConfig")
    assert "_set_envs_and_config" in top_level_names(root, "srt/entrypoints/engine.py")
    assert "initialize_moe_config" in top_level_names(root, "srt/layers/moe/__init__.py")
    assert "initialize_fp8_gemm_config" in top_level_names(root, "srt/layers/quantization/fp8_utils.py")
    assert "initialize_fp4_gemm_config" in top_level_names(root, "srt/layers/quantization/fp4_utils.py")
    assert "get_input_embeddings" in members(root, "srt/models/qwen3.py", "Qwen3ForCausalLM")


def test_pools_have_what_the_engine_calls(root):
    r2t = members(root, "srt/mem_cache/memory_pool.py", "ReqToTokenPool")
    assert {"alloc", "free", "available_size"} <= r2t
    assert params(root, "srt/mem_cache/memory_pool.py", "ReqToTokenPool", "alloc") == {"self", "reqs"}
    assert {"alloc", "free", "available_size"} <= members(
        root, "srt/mem_cache/allocator/token.py", "TokenToKVPoolAllocator"
    )


def test_forward_batch_fields_the_engine_sets(root):
    """The attributes SGLangEngine gives a ForwardBatch (recorded over the CPU stand-in, for a decode step and
    a mixed extend step) are fields of SGLang's ForwardBatch; the modes it names exist."""
    from fake_sglang import fake_sglang_engine

    from tokenrouter.runtime.engine.base import StepInput

    engine = fake_sglang_engine(load_engine(TINY_SMALL), pool=128)
    seen: list[set[str]] = []
    forward = engine.runner.forward
    engine.runner.forward = lambda fb: (seen.append(set(vars(fb))), forward(fb))[1]
    engine.forward([StepInput("a", [1, 2, 3]), StepInput("b", [4])], want_hidden=True)
    engine.forward([StepInput("a", [5]), StepInput("b", [6])])
    assert len(seen) == 2
    fields = members(root, "srt/model_executor/forward_batch_info.py", "ForwardBatch")
    for used in seen:
        assert used <= fields, used - fields
    assert {"DECODE", "EXTEND"} <= members(root, "srt/model_executor/forward_batch_info.py", "ForwardMode")
    assert {"NULL", "LAST"} <= members(root, "srt/model_executor/forward_batch_info.py", "CaptureHiddenMode")
    assert "NONE" in members(root, "srt/speculative/spec_info.py", "SpeculativeAlgorithm")
