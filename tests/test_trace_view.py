"""`tokenrouter trace`: each saved format (as the commands wrote them: tests/fixtures/traces/) to HTML and PNG, and
clear errors for anything else."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.plotting import model_colors
from tokenrouter.trace_view import TraceFormatError, load, to_html

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
runner = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"


def test_generate_json_and_its_trace_table_read_alike():
    a, b = load(FIXTURES / "generate.json"), load(FIXTURES / "generate-trace.txt")
    assert a.writers == b.writers and a.pieces == b.pieces and len(a.writers) == 20
    assert a.tokens_per_model == b.tokens_per_model == {x: a.writers.count(x) for x in ("slm", "llm")}
    assert a.hops == b.hops == 11


def test_a_response_and_its_routing_alone():
    resp = json.loads((FIXTURES / "response.json").read_text())
    t = load(FIXTURES / "response.json")
    routing = resp["choices"][0]["routing"]
    assert t.writers == routing["trace"] and t.tokens_per_model == routing["tokens_per_model"]
    assert t.text == resp["choices"][0]["text"] and t.pieces is None


def test_the_html_colours_each_token_by_its_model_and_marks_the_hops(tmp_path):
    t = load(FIXTURES / "generate.json")
    page = to_html(t, "generate.json")
    colors = model_colors(t.models)
    spans = re.findall(r'<span class="tok( hop)?" style="background:(#\w{6})55[^"]*" title="(\w+)">', page)
    assert [m for _, _, m in spans] == t.writers
    assert all(c == colors[m] for _, c, m in spans)
    assert [i for i, (h, _, _) in enumerate(spans) if h] == [
        i for i in range(1, len(t.writers)) if t.writers[i] != t.writers[i - 1]
    ]
    assert "http" not in page and "<script" not in page  # standalone


@pytest.mark.parametrize("name", ["generate.json", "generate-trace.txt", "response.json", "bench.json"])
def test_the_command_writes_html_and_png(tmp_path, name):
    out, png = tmp_path / "t.html", tmp_path / "t.png"
    res = runner.invoke(app, ["trace", str(FIXTURES / name), "-o", str(out), "--png", str(png)])
    assert res.exit_code == 0, res.output
    assert res.output == f"wrote {out}\nwrote {png}\n"
    assert out.read_text().startswith("<!doctype html>") and png.read_bytes()[:8] == PNG


def test_a_bench_report_shows_each_requests_shares():
    t = load(FIXTURES / "bench.json")
    report = json.loads((FIXTURES / "bench.json").read_text())
    assert t.writers is None and len(t.requests) == report["completed"]
    assert t.tokens_per_model == report["tokens_per_model"]
    assert to_html(t).count("class='bar'") == len(t.requests)


def test_a_matrix_record_holding_a_report(tmp_path):
    rec = tmp_path / "record.json"
    rec.write_text(
        json.dumps({"mode": "tokenrouter", "report": json.loads((FIXTURES / "bench.json").read_text())})
    )
    assert load(rec).requests == load(FIXTURES / "bench.json").requests


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"a": 1}', "not a saved trace; expected a response JSON"),
        ("[1, 2]", "not a saved trace"),
        ("policy p\n", "not JSON, nor a `generate --trace` table"),
        ('{"choices": [{"text": "x"}]}', "not a saved trace"),
    ],
)
def test_other_files_get_a_clear_error(tmp_path, content, message):
    f = tmp_path / "in.json"
    f.write_text(content)
    with pytest.raises(TraceFormatError, match=re.escape(message)):
        load(f)
    res = runner.invoke(app, ["trace", str(f), "-o", str(tmp_path / "o.html")])
    assert res.exit_code == 1 and message in res.output and "Traceback" not in res.output


def test_usage_errors(tmp_path):
    src = tmp_path / "g.json"
    shutil.copy(FIXTURES / "generate.json", src)
    for args, code, message in [
        ([], 2, "give -o OUT.html, --png OUT.png, or both"),
        (["--png", str(tmp_path / "x.jpg")], 2, "--png takes a .png file name"),
        (["-o", str(src)], 1, "is this command's input"),
        (["-o", str(tmp_path / "no" / "x.html")], 1, "no folder"),
    ]:
        res = runner.invoke(app, ["trace", str(src), *args])
        assert res.exit_code == code and message in res.output, (args, res.output)
    res = runner.invoke(app, ["trace", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.html")])
    assert res.exit_code == 1 and "no such file" in res.output
