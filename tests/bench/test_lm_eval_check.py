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


def test_the_multiple_choice_tasks_ship_their_documents():
    for name, base in (("arithmetic_mc", "arithmetic"), ("python_mc", "python")):
        rows = [json.loads(line) for line in (TASK_DOCS.parent / f"{name}.jsonl").read_text().splitlines()]
        plain = [json.loads(line) for line in (TASK_DOCS.parent / f"{base}.jsonl").read_text().splitlines()]
        assert len(rows) == len(plain) == 20
        for r, p in zip(rows, plain, strict=True):
            assert len(set(r["choices"])) == 4 and r["choices"][r["label"]] == p["answer"]
        assert {r["label"] for r in rows} == {0, 1, 2, 3}


def test_choice_scores_name_each_continuation_and_the_right_one(le, tmp_path):
    sample = {"target": "1", "arguments": {"gen_args_0": {"arg_0": "Q", "arg_1": " 4"},
                                           "gen_args_1": {"arg_0": "Q", "arg_1": " 5"}},
              "filtered_resps": [["-3.5", "False"], ["-1.25", "True"]]}  # fmt: skip
    (tmp_path / "samples_t_1.jsonl").write_text(json.dumps(sample) + "\n")
    assert le.choice_scores(tmp_path, "t") == "' 4': -3.50, ' 5': -1.25; right: ' 5'"


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
    mc = le.lm_eval_command("local-completions", "http://h:1/v1/completions", "pol", Path("/m"), args, tmp_path,
                            "tr_arithmetic_mc")  # fmt: skip
    assert mc[mc.index("--tasks") + 1] == "tr_arithmetic_mc"


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
        results = le_results(tmp_path / f"{backend}-tr_arithmetic")
        assert 0.0 <= results["tr_arithmetic"]["exact_match,strip"] <= 1.0
        assert f"{backend} tr_arithmetic: " in proc.stdout and "4 answers" in proc.stdout
    assert "|tr_arithmetic|" in proc.stdout
    # the loglikelihood task, on the completions backend (echo with prompt logprobs)
    mc = le_results(tmp_path / "local-completions-tr_arithmetic_mc")["tr_arithmetic_mc"]
    assert 0.0 <= mc["acc,none"] <= 1.0 and "|tr_arithmetic_mc|" in proc.stdout
    assert "local-completions tr_arithmetic_mc: " in proc.stdout and "; right: ' 44'" in proc.stdout


def le_results(folder: Path) -> dict:
    return json.loads(next(folder.rglob("results_*.json")).read_text())["results"]
