"""SGLang is optional: without it everything else works, and `engine: "sglang"` gives a clear error.

These run on every machine: SGLang's absence is forced with `sys.modules["sglang"] = None` (an import of it
then raises ImportError), and a wrong version with a stand-in module, so the checks do not depend on what is
installed where the tests run.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tokenrouter.runtime.engine.base import EngineError

REPO = Path(__file__).resolve().parents[2]
TINY_SMALL = REPO / "examples" / "models" / "tiny-small"
TINY_LARGE = REPO / "examples" / "models" / "tiny-large"


@pytest.fixture
def no_sglang(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)


def test_importing_the_module_does_not_import_sglang(no_sglang):
    """With any import of sglang failing, (re)loading the engine module and the subserver's loader works."""
    import tokenrouter.runtime.engine.sglang_engine as mod
    import tokenrouter.runtime.subserver.loading as loading

    importlib.reload(mod)
    importlib.reload(loading)
    assert sys.modules["sglang"] is None


def test_absent_sglang_is_a_clear_engine_error(no_sglang):
    from tokenrouter.runtime.engine.sglang_engine import SGLANG_VERSION, load_sglang_engine

    with pytest.raises(EngineError) as info:
        load_sglang_engine(TINY_SMALL, model="slm", device="cpu")
    msg = str(info.value)
    assert "model 'slm'" in msg and "not installed" in msg
    assert f"pip install 'sglang=={SGLANG_VERSION}'" in msg and "docs/sglang.md" in msg
    assert 'engine: "embedded"' in msg


def test_wrong_sglang_version_is_refused(monkeypatch):
    from tokenrouter.runtime.engine.sglang_engine import SGLANG_VERSION, load_sglang_engine

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(__version__="0.4.0"))
    with pytest.raises(EngineError, match=f"written against SGLang {SGLANG_VERSION}, found 0.4.0"):
        load_sglang_engine(TINY_SMALL, model="slm", device="cpu")


def test_present_sglang_still_needs_cuda(monkeypatch):
    from tokenrouter.runtime.engine.sglang_engine import SGLANG_VERSION, load_sglang_engine

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(__version__=SGLANG_VERSION))
    with pytest.raises(EngineError, match="model 'slm': engine 'sglang' needs a CUDA device"):
        load_sglang_engine(TINY_SMALL, model="slm", device="cpu")


@pytest.mark.parametrize(
    ("kw", "word"),
    [
        (dict(attention="sdpa"), "attention 'triton' only"),
        (dict(device="gpu0"), "bad device"),
        (dict(dtype="float32"), "dtype"),
        (dict(max_batch=0), "max_batch"),
        (dict(max_tokens=64, mem_bytes=1 << 20), "not both"),
        (dict(load="safetensors"), "load"),
        (dict(mem_fraction_static=1.5), "mem_fraction_static"),
    ],
)
def test_bad_settings_are_value_errors(kw, word):
    from tokenrouter.runtime.engine.sglang_engine import load_sglang_engine

    with pytest.raises(ValueError, match=word):
        load_sglang_engine(TINY_SMALL, **kw)


def test_plan_asking_for_sglang_fails_with_the_model_named(no_sglang):
    from tokenrouter.runtime.subserver.loading import load_model_runtime

    plan = {"models": {"llm": {"path": str(TINY_LARGE), "engine": "sglang"}}}
    with pytest.raises(EngineError, match="model 'llm': engine 'sglang' needs SGLang .* not installed"):
        load_model_runtime(plan, "llm", "cpu")


def test_unknown_engine_kind_is_refused():
    from tokenrouter.runtime.subserver.loading import load_model_runtime

    plan = {"models": {"llm": {"path": str(TINY_LARGE), "engine": "vllm"}}}
    with pytest.raises(ValueError, match="unknown engine 'vllm'"):
        load_model_runtime(plan, "llm", "cpu")


def test_generate_with_an_sglang_model_says_so_without_a_traceback(tmp_path):
    """The CLI path: a policy whose large model asks for SGLang, where SGLang is absent."""
    pytest.importorskip("lark")
    if _sglang_installed():
        pytest.skip("SGLang is installed here: the absence cannot be shown through a subprocess")
    policy = f"""policy p "absent sglang"
model slm = "{TINY_SMALL}" {{ gpu: 0, batch: 1 }}
model llm = "{TINY_LARGE}" {{ gpu: 0, batch: 1, engine: "sglang" }}
entry slm
route slm {{
  when uniform() < 0.5 -> llm
}}
route llm {{
  -> slm
}}
"""
    path = tmp_path / "p.tr"
    path.write_text(policy)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokenrouter.cli",
            "generate",
            str(path),
            "--prompt-ids",
            "5,6,7",
            "--max-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert "model 'llm'" in out.stderr and "not installed" in out.stderr


def _sglang_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None
