"""The launcher: usage errors, startup failures named clearly, and a subserver killed under load."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from frontend_helpers import MODELS, ROOT, Server, free_port, write_policy

from tokenrouter.compiler.driver import compile_file
from tokenrouter.compiler.plan import write_plan


def _serve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenrouter.cli", "serve", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "args",
    [["no/such.plan"], ["{policy}", "--device", "tpu"], ["{policy}", "--port", "70000"]],
)
def test_bad_usage_exits_2(tmp_path, args):
    policy = str(write_policy(tmp_path))
    r = _serve(*(a.format(policy=policy) for a in args), timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_missing_model_folder_names_the_path(tmp_path):
    missing = tmp_path / "models" / "nowhere"
    r = _serve(str(write_policy(tmp_path, large=missing)), "--port", "0", timeout=60)
    assert r.returncode == 1
    assert "model 'llm'" in r.stderr and str(missing) in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_device_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = _serve(str(write_policy(tmp_path)), "--device", "cuda", "--port", "0", timeout=60)
    assert r.returncode == 1 and "no CUDA device" in r.stderr and "Traceback" not in r.stderr


def test_policy_with_errors_shows_diagnostics(tmp_path):
    bad = tmp_path / "bad.tr"
    bad.write_text(write_policy(tmp_path).read_text().replace("entry slm", "entry nosuch"))
    r = _serve(str(bad), "--port", "0", timeout=60)
    assert r.returncode == 1
    assert f"{bad}:" in r.stderr and "error" in r.stderr and "Traceback" not in r.stderr


def test_broken_model_folder_fails_startup_naming_the_subserver(tmp_path):
    broken = tmp_path / "broken-large"
    shutil.copytree(MODELS / "tiny-large", broken)
    (broken / "config.json").write_text("{ this is not json")
    result = compile_file(write_policy(tmp_path, large=broken))  # served as a .plan this time
    assert result.ok, result.diagnostics
    write_plan(result.plan, tmp_path / "testmix.plan")
    r = _serve(str(tmp_path / "testmix.plan"), "--port", "0")
    assert r.returncode == 1, r.stderr
    assert "subserver 'llm' failed to start" in r.stderr, r.stderr
    assert r.stdout == ""
    # the user's mistake is one line that names the file, not the subserver's traceback (an audit found ~25
    # lines of it before the error line); weights of another shape are one too
    assert "Traceback" not in r.stderr and f"{broken / 'config.json'}" in r.stderr, r.stderr
    shutil.copytree(MODELS / "tiny-large", broken, dirs_exist_ok=True)
    shutil.copy(MODELS / "py-large" / "model.safetensors", broken / "model.safetensors")
    r = _serve(str(tmp_path / "testmix.plan"), "--port", "0")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "subserver 'llm' failed to start" in r.stderr and "the config needs" in r.stderr, r.stderr
    # that line alone besides the start-up's phase lines (the frontend logged one more before)
    assert [x for x in r.stderr.splitlines() if not x.startswith("tokenrouter: model ")] == [
        r.stderr.splitlines()[-1]
    ], r.stderr


def test_models_that_no_longer_share_a_vocabulary_fail_before_loading(tmp_path):
    large = tmp_path / "large"
    shutil.copytree(MODELS / "tiny-large", large)
    result = compile_file(write_policy(tmp_path, large=large))
    assert result.ok, result.diagnostics
    write_plan(result.plan, tmp_path / "testmix.plan")
    config = json.loads((large / "config.json").read_text())
    (large / "config.json").write_text(json.dumps({**config, "vocab_size": 4096}))  # changed since compiled
    r = _serve(str(tmp_path / "testmix.plan"), "--port", "0", timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stdout == "", r.stderr
    assert "error: models 'slm' (" in r.stderr and f"'llm' ({large})" in r.stderr, r.stderr
    assert "vocab_size 512 and 4096" in r.stderr and "failed to start" not in r.stderr, r.stderr


def test_port_in_use_fails_before_loading_models(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = _serve(str(write_policy(tmp_path)), "--port", str(port))
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_killed_subserver_fails_requests_promptly_and_launcher_exits_nonzero(tmp_path):
    port = free_port()
    health: list[int] = []
    starting = threading.Event()
    watcher = threading.Thread(target=_watch_health, args=(port, health, starting), daemon=True)
    watcher.start()
    srv = Server(write_policy(tmp_path), "--tcp", log_dir=tmp_path, port=port)
    starting.set()
    watcher.join(10)
    try:
        assert 503 in health, f"/health never said 'starting' (503) before ready: {health}"
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
        info = httpx.get(f"{srv.url}/server_info", timeout=10).json()
        eps = info["endpoints"]
        assert all(
            a.startswith("tcp://") for a in [eps["launcher"], eps["frontend"], *eps["subservers"].values()]
        )
        pids = json.loads((Path(info["run_dir"]) / "pids.json").read_text())
        assert pids["subservers"]["llm"] == info["subservers"]["llm"]["pid"]
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=60)
        kw = dict(model="testmix", max_tokens=3000, extra_body={"ignore_eos": True})
        errors: list[tuple[float, str]] = []

        def streamed(i: int) -> None:
            try:
                for _ in client.completions.create(prompt=f"def f{i}():", stream=True, **kw):
                    pass
                errors.append((time.monotonic(), "no error"))
            except openai.APIError as e:
                errors.append((time.monotonic(), str(e)))

        def plain(i: int) -> None:
            try:
                client.completions.create(prompt=f"x{i} =", **kw)
                errors.append((time.monotonic(), "no error"))
            except openai.APIStatusError as e:
                errors.append((time.monotonic(), f"{e.status_code} {e}"))

        threads = [threading.Thread(target=f, args=(i,)) for i in range(3) for f in (streamed, plain)]
        for t in threads:
            t.start()
        _wait_tokens(srv.url)
        os.kill(pids["subservers"]["llm"], signal.SIGKILL)
        killed_at = time.monotonic()
        for t in threads:
            t.join(30)
        assert len(errors) == 6, errors
        for at, text in errors:
            assert "subserver 'llm'" in text, text
            assert at - killed_at < 10, f"{at - killed_at:.1f} s to fail a request"
        assert sum(t.startswith("503") for _, t in errors) == 3
        assert srv.wait(30) == 1
        assert "subserver 'llm' failed: killed by SIGKILL" in srv.stderr()
        assert not os.path.exists(info["run_dir"])
        for pid in [pids["frontend"], *pids["subservers"].values()]:
            assert not _alive(pid), f"process {pid} survived the shutdown"
    finally:
        srv.stop()


def _watch_health(port: int, statuses: list[int], done: threading.Event) -> None:
    while not done.is_set():
        try:
            statuses.append(httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code)
        except httpx.TransportError:
            pass
        time.sleep(0.05)


def _wait_tokens(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        if 'tokenrouter_generation_tokens_total{model="llm"} 0' not in text and "requests_active 6" in text:
            return
        time.sleep(0.1)
    pytest.fail("requests did not get going")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_serve_max_body_mib_reaches_the_frontend(tmp_path):
    """`serve --max-body-mib`: a body over the limit gets the 413 (here 0.01 MiB, so a 12 KiB prompt does),
    one under it is served; a size that is no size is a usage error before anything starts."""
    r = _serve(str(write_policy(tmp_path)), "--max-body-mib", "nan", timeout=60)
    assert r.returncode == 2 and "--max-body-mib nan" in r.stderr and "Traceback" not in r.stderr
    srv = Server(write_policy(tmp_path), "--max-body-mib", "0.01", log_dir=tmp_path)
    try:
        big = httpx.post(
            f"{srv.url}/v1/completions", json={"prompt": "x" * 12_000, "max_tokens": 1}, timeout=60
        )
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large", big.text
        small = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "def f", "max_tokens": 2}, timeout=60)
        assert small.status_code == 200, small.text
    finally:
        srv.stop(signal.SIGINT)
