"""`bench/sglang_only.py`: skips clearly without SGLang; with a server, starts it, loads it, stops it.

The second test runs the script against a stand-in `sglang.launch_server` (a small OpenAI-style streaming
server written into a temporary --sglang-path), so the orchestration is checked on CPU: the arguments the
real server would get, PYTHONPATH given to the server only, readiness, the load's numbers, and the stop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "sglang_only.py"
TINY_LARGE = REPO / "examples" / "models" / "tiny-large"

FAKE_SERVER = """
import json, os, sys, time
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

argv = sys.argv[1:]
with open(os.environ["FAKE_ARGV_OUT"], "w") as f:
    json.dump({"argv": argv, "pythonpath": os.environ.get("PYTHONPATH", "")}, f)
port = int(argv[argv.index("--port") + 1])
app = FastAPI()

@app.get("/v1/models")
def models():
    return {"data": [{"id": "fake-llm"}]}

@app.post("/v1/completions")
async def completions(request: Request):
    body = await request.json()
    n = body["max_tokens"]
    def events():
        for _ in range(n):
            time.sleep(0.001)
            yield "data: " + json.dumps({"choices": [{"index": 0, "text": "x"}]}) + "\\n\\n"
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
        yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\\n\\n"
        yield "data: [DONE]\\n\\n"
    return StreamingResponse(events(), media_type="text/event-stream")

uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")
"""


def test_exits_with_a_clear_message_without_sglang(tmp_path):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model-path", str(TINY_LARGE), "--sglang-path", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 3
    assert "sglang-only baseline skipped" in out.stderr and "holds no sglang package" in out.stderr


def test_runs_the_load_against_the_server_it_starts(tmp_path):
    pytest.importorskip("uvicorn")
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(FAKE_SERVER)
    argv_out = tmp_path / "argv.json"
    report = tmp_path / "out" / "report.json"
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model-path", str(TINY_LARGE), "--load-format", "dummy",
         "--sglang-path", str(site), "-c", "2", "-c", "4", "-n", "6", "--output-len", "5",
         "--start-timeout", "60", "--json", str(report)],
        capture_output=True, text=True, timeout=120,
        env={"FAKE_ARGV_OUT": str(argv_out), "PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    started = json.loads(argv_out.read_text())
    argv = started["argv"]
    assert argv[argv.index("--model-path") + 1] == str(TINY_LARGE)
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert argv[argv.index("--attention-backend") + 1] == "triton"
    assert started["pythonpath"].split(":")[0] == str(site)
    reports = json.loads(report.read_text())
    assert [r["spec"]["concurrency"] for r in reports] == [2, 4]
    for r in reports:
        assert r["mode"] == "sglang-only" and r["model"] == "fake-llm"
        assert r["completed"] == 6 and r["failed"] == 0 and r["output_tokens"] == 30
    assert "sglang-only, concurrency 4" in out.stdout


def test_a_sigterm_while_the_server_starts_stops_the_server(tmp_path):
    """`timeout` sends SIGTERM: the script stops the server it started (its own session) before exiting. Before
    the handler, a killed script left SGLang's server holding 68 GiB of the GPU."""
    import signal
    import time

    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    pid_file = tmp_path / "server.pid"
    (pkg / "launch_server.py").write_text(  # never answers
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--model-path", str(TINY_LARGE),
                             "--sglang-path", str(tmp_path / "site"), "--start-timeout", "300"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    server = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(server, signal.SIGKILL)
        pytest.fail("the server outlived the script")
