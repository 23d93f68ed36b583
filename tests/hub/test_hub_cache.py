"""Hub ids resolved through a hub-cache layout built on disk (no network): found, missing, pinned revisions,
the compiler's located diagnostic, `tokenrouter download` and a policy of hub ids generating end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenrouter import hub
from tokenrouter.cli import app
from tokenrouter.compiler.driver import compile_file

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"
REV = "0123456789abcdef0123456789abcdef01234567"
OLD = "fedcba9876543210fedcba9876543210fedcba98"
POLICY = """\
policy hubmix "two tiny models named by hub id"
model slm = "{small}" {{ gpu: 0, batch: 1 }}
model llm = "{large}" {{ gpu: 0, batch: 1 }}
entry slm
route slm {{
  when uniform() < 0.5 -> llm
}}
"""
runner = CliRunner()


def add_repo(cache: Path, repo: str, folder: Path, rev: str = REV, ref: str | None = "main") -> Path:
    """models--ORG--NAME/snapshots/REV/<files> (+ refs/REF), as huggingface_hub lays a download out."""
    base = cache / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / rev
    shutil.copytree(folder, snap)
    if ref:
        (base / "refs").mkdir(parents=True, exist_ok=True)
        (base / "refs" / ref).write_text(rev)
    return snap


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hf-cache"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


def test_cached_found_missing_and_revision(cache: Path) -> None:
    snap = add_repo(cache, "org/tiny-small", MODELS / "tiny-small")
    add_repo(cache, "org/tiny-small", MODELS / "tiny-large", rev=OLD, ref=None)
    assert hub.cached("org/tiny-small") == snap
    assert hub.cached(f"org/tiny-small@{REV}") == snap
    assert json.loads((hub.cached(f"org/tiny-small@{OLD}") / "config.json").read_text()) == json.loads(
        (MODELS / "tiny-large" / "config.json").read_text()
    )
    assert hub.cached("org/tiny-small@v2") is None  # no such ref in the cache
    assert hub.cached("org/absent") is None
    assert hub.model_folder("org/tiny-small", fetch=True) == str(snap)


def test_hf_home_gives_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub.cache_dir() == tmp_path / "home" / "hub"
    snap = add_repo(tmp_path / "home" / "hub", "org/tiny-small", MODELS / "tiny-small")
    assert hub.cached("org/tiny-small") == snap


def test_offline_and_missing_is_one_clear_error(cache: Path) -> None:
    with pytest.raises(hub.HubError) as e:
        hub.model_folder("Qwen/Qwen3-8B@abc", fetch=True, source="p.tr")
    msg = str(e.value)
    assert "'Qwen/Qwen3-8B@abc'" in msg and str(cache) in msg and "HF_HUB_OFFLINE" in msg
    assert "`tokenrouter download p.tr`" in msg
    with pytest.raises(hub.HubError, match="hf download Qwen/Qwen3-8B --revision abc"):
        hub.model_folder("Qwen/Qwen3-8B@abc", fetch=False)


def test_safetensors_only(cache: Path, tmp_path: Path) -> None:
    pt = tmp_path / "pt"
    pt.mkdir()
    (pt / "config.json").write_text("{}")
    (pt / "pytorch_model.bin").write_bytes(b"x")
    add_repo(cache, "org/pt-only", pt)
    with pytest.raises(hub.HubError, match="safetensors only"):
        hub.model_folder("org/pt-only", fetch=False)


def test_hub_id_syntax() -> None:
    assert hub.is_hub_id("Qwen/Qwen3-8B") and hub.is_hub_id("Qwen/Qwen3-8B@main")
    assert hub.split("Qwen/Qwen3-8B@refs/pr/1") == ("Qwen/Qwen3-8B", "refs/pr/1")
    assert (
        not hub.is_hub_id("./models/x") and not hub.is_hub_id("a/b/c") and not hub.is_hub_id("r.safetensors")
    )


def test_check_finds_cached_ids_and_locates_missing_ones(cache: Path, tmp_path: Path) -> None:
    add_repo(cache, "org/tiny-small", MODELS / "tiny-small")
    src = tmp_path / "p.tr"
    src.write_text(POLICY.format(small="org/tiny-small", large="org/tiny-large"))
    result = compile_file(src, {})
    assert result.plan is not None
    assert result.plan["models"]["slm"]["path"] == "org/tiny-small"  # the plan keeps the id: portable
    warnings = [d for d in result.diagnostics if d.severity == "warning"]
    assert len(warnings) == 1, warnings
    w = warnings[0]
    assert w.line == 3 and "'org/tiny-large'" in w.message
    assert str(cache) in w.message and f"tokenrouter download {src}" in w.message


def test_download_cached_and_offline_missing(cache: Path, tmp_path: Path) -> None:
    add_repo(cache, "org/tiny-small", MODELS / "tiny-small")
    src = tmp_path / "p.tr"
    src.write_text(POLICY.format(small="org/tiny-small", large=MODELS / "tiny-large"))
    res = runner.invoke(app, ["download", str(src)])
    assert res.exit_code == 0, res.output
    assert "org/tiny-small already cached" in res.output and "local folder" in res.output
    src.write_text(POLICY.format(small="org/tiny-small", large="org/tiny-large"))
    res = runner.invoke(app, ["download", str(src)])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "error: model 'llm': 'org/tiny-large' is not in the hub cache" in res.output
    assert "HF_HUB_OFFLINE is set" in res.output


def test_a_policy_of_hub_ids_generates_offline(cache: Path, tmp_path: Path) -> None:
    add_repo(cache, "org/tiny-small", MODELS / "tiny-small")
    add_repo(cache, "org/tiny-large", MODELS / "tiny-large")
    hub_tr, local_tr = tmp_path / "hub.tr", tmp_path / "local.tr"
    hub_tr.write_text(POLICY.format(small="org/tiny-small", large=f"org/tiny-large@{REV}"))
    local_tr.write_text(POLICY.format(small=MODELS / "tiny-small", large=MODELS / "tiny-large"))
    args = ["--prompt", "hello", "--max-tokens", "6", "--json", "--ignore-eos"]
    out = [runner.invoke(app, ["generate", str(p), *args]) for p in (hub_tr, local_tr)]
    assert [r.exit_code for r in out] == [0, 0], out[0].output
    assert json.loads(out[0].stdout)["token_ids"] == json.loads(out[1].stdout)["token_ids"]


def test_serve_resolves_before_starting(cache: Path, tmp_path: Path) -> None:
    from tokenrouter.runtime.launcher import LaunchError, load_plan

    src = tmp_path / "p.tr"
    src.write_text(POLICY.format(small="org/tiny-small", large=MODELS / "tiny-large"))
    with pytest.raises(LaunchError, match=r"model 'slm': 'org/tiny-small' is not in the hub cache"):
        load_plan(str(src), tmp_path)
    snap = add_repo(cache, "org/tiny-small", MODELS / "tiny-small")
    plan, path = load_plan(str(src), tmp_path)
    assert plan["models"]["slm"]["path"] == str(snap) and Path(path).parent == tmp_path
