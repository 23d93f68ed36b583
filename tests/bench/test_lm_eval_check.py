"""bench/lm_eval_check.py: lm-eval's `local-completions` and `local-chat-completions` backends against a real
`tokenrouter serve` on the tiny example models (when lm-eval is installed), and the script's own parts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TASK_DOCS = ROOT / "bench" / "lm_eval" / "arithmetic.jsonl"


@pytest.fixture
def le(bench_script):
    return bench_script("lm_eval_check")


def test_the_task_ships_its_documents():
    rows = [json.loads(line) for line in TASK_DOCS.read_text().splitlines()]
    assert len(rows) == 20
    for r in rows:
        a, op, b, _ = r["question"].split()
        assert r["answer"] == str(int(a) + int(b) if op == "+" else int(a) - int(b))


def test_the_python_task_ships_its_documents():
    rows = [json.loads(line) for line in (TASK_DOCS.parent / "python.jsonl").read_text().splitlines()]
    assert len(rows) == 20
    assert all(r["prefix"] and r["answer"] and "\n" not in r["answer"] for r in rows)


def test_commands_name_the_endpoint_tokenizer_and_task(le, tmp_path):
    args = le.argparse.Namespace(concurrent=2, tasks="tr_arithmetic", limit=5)
    cmd = le.lm_eval_command(
        "local-completions", "http://h:1/v1/completions", "pol", Path("/m"), args, tmp_path
    )
    model_args = cmd[cmd.index("--model_args") + 1]
    assert "base_url=http://h:1/v1/completions" in model_args and "model=pol" in model_args
    assert "tokenizer=/m" in model_args and "tokenizer_backend=huggingface" in model_args
    assert cmd[cmd.index("--include_path") + 1] == str(le.TASKS_DIR)
    assert cmd[cmd.index("--limit") + 1] == "5"
    chat = le.lm_eval_command("local-chat-completions", "http://h:1/v1/chat/completions", "pol", Path("/m"), args,
                              tmp_path)  # fmt: skip
    assert "tokenizer_backend=none" in chat[chat.index("--model_args") + 1]


def test_results_and_answers_are_read_from_the_newest_files(le, tmp_path):
    run = tmp_path / "pol"
    run.mkdir()
    (run / "results_1.json").write_text(json.dumps({"results": {"t": {"exact_match,strip": 0.25}}}))
    samples = [{"filtered_resps": ["4"]}, {"filtered_resps": [""]}]
    (run / "samples_t_1.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    assert le.results(tmp_path) == {"t": {"exact_match,strip": 0.25}}
    assert le.answers(tmp_path, "t") == ["4", ""]
    with pytest.raises(RuntimeError, match="no samples_u_"):
        le.answers(tmp_path, "u")


def test_a_wrong_model_folder_is_a_clear_error(le, tmp_path, capsys):
    assert le.main(["--small", str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 2
    assert "--small" in capsys.readouterr().err


@pytest.mark.slow
def test_end_to_end_on_the_tiny_models(tmp_path):
    pytest.importorskip("lm_eval")
    pytest.importorskip("tenacity")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "lm_eval_check.py"), "--limit", "4", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for backend in ("local-completions", "local-chat-completions"):
        results = json.loads(next((tmp_path / backend).rglob("results_*.json")).read_text())["results"]
        assert 0.0 <= results["tr_arithmetic"]["exact_match,strip"] <= 1.0
        assert f"{backend} tr_arithmetic: " in proc.stdout and "4 answers" in proc.stdout
    assert "|tr_arithmetic|" in proc.stdout
    assert "loglikelihood tasks: not run" in proc.stdout and "400: echo is not supported" in proc.stdout
