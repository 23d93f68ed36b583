"""Subservers on other hosts (`serve --tcp --remote MODEL=HOST:PORT` + `tokenrouter subserver`), over loopback:
the "other host" is a separately started `tokenrouter subserver` process on 127.0.0.1 with its own port."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest
from frontend_helpers import ROOT, Server, free_port, write_policy

from tokenrouter.runtime.ipc import Endpoints

CLI = [sys.executable, "-m", "tokenrouter.cli"]


class Remote:
    """Waits for the launcher's printed `tokenrouter subserver ...` command (stderr) and runs it, as a user
    would on the remote host."""

    def __init__(self, stderr_path: Path, log_dir: Path) -> None:
        self.stderr_path = stderr_path
        self.log = log_dir / "remote.stderr"
        self.command: list[str] | None = None
        self.proc: subprocess.Popen | None = None
        self.thread = threading.Thread(target=self._start, daemon=True)
        self.thread.start()

    def _start(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = self.stderr_path.read_text() if self.stderr_path.exists() else ""
            lines = [x.strip() for x in text.splitlines() if x.startswith("  tokenrouter subserver ")]
            if lines:
                self.command = shlex.split(lines[0])
                with open(self.log, "w") as err:
                    self.proc = subprocess.Popen(CLI + self.command[1:], cwd=ROOT, stderr=err)
                return
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _serve_with_remote(tmp_path: Path, *extra: str) -> tuple[Server, Remote, int]:
    port = free_port()
    remote = Remote(tmp_path / "serve.stderr", tmp_path)
    args = ("--tcp", "--remote", f"llm=127.0.0.1:{port}", "--heartbeat-timeout", "3", *extra)
    return Server(write_policy(tmp_path), *args, log_dir=tmp_path), remote, port


def test_remote_subserver_routes_exactly_and_stops_with_the_launcher(tmp_path):
    from tokenrouter.compiler.driver import load_plan
    from tokenrouter.runtime.frontend.codec import TextCodec
    from tokenrouter.runtime.messages import SamplingSpec
    from tokenrouter.runtime.reference import ReferenceModel, reference_generate
    from tokenrouter.runtime.subserver.loading import load_model_runtime

    srv, remote, port = _serve_with_remote(tmp_path)
    try:
        assert remote.command[:2] == ["tokenrouter", "subserver"] and "--endpoints" in remote.command
        eps = Endpoints.parse(remote.command[remote.command.index("--endpoints") + 1])
        assert eps.subservers["llm"] == f"tcp://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=60)
        plan = load_plan(tmp_path / "testmix.tr")
        loaded = {x: load_model_runtime(plan, x, "cpu") for x in plan["models"]}
        refs = {x: ReferenceModel.from_engine(engine) for x, (engine, _) in loaded.items()}
        kernels = {x: kernel for x, (_, kernel) in loaded.items()}
        prompt = [5, 17, 42, 99]
        r = client.completions.create(
            model="testmix", prompt=prompt, max_tokens=12, temperature=0, seed=7,
            extra_body={"ignore_eos": True, "return_routing_trace": True},
        )  # fmt: skip
        ref = reference_generate(
            plan, refs, kernels, prompt, SamplingSpec(temperature=0.0, seed=7, max_tokens=12, ignore_eos=True)
        )
        trace = r.choices[0].model_extra["routing"]["trace"]
        assert "llm" in trace and trace == ref.models
        tokenizer = TextCodec(plan["models"][plan["entry"]]["path"]).tokenizer
        assert r.choices[0].text == tokenizer.decode(ref.token_ids, skip_special_tokens=True)
        assert srv.stop(signal.SIGTERM) == 0, srv.stderr()
        assert remote.proc.wait(15) == 0  # the launcher's Shutdown reached the remote subserver
    finally:
        srv.stop()
        remote.stop()


def test_killed_remote_subserver_fails_requests_within_seconds(tmp_path):
    srv, remote, _ = _serve_with_remote(tmp_path)
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=60)
        kw = dict(model="testmix", max_tokens=3000, extra_body={"ignore_eos": True})
        errors: list[tuple[float, str]] = []

        def plain(i: int) -> None:
            try:
                client.completions.create(prompt=f"x{i} =", **kw)
                errors.append((time.monotonic(), "no error"))
            except openai.APIStatusError as e:
                errors.append((time.monotonic(), f"{e.status_code} {e}"))

        threads = [threading.Thread(target=plain, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        remote.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        for t in threads:
            t.join(30)
        assert len(errors) == 3, errors
        for at, text in errors:
            assert text.startswith("503") and "subserver 'llm'" in text and "heartbeat" in text, text
            assert at - killed_at < 8, f"{at - killed_at:.1f} s to fail a request"
        assert srv.wait(30) == 1
        assert "subserver 'llm' failed: remote subserver at tcp://127.0.0.1:" in srv.stderr()
    finally:
        srv.stop()
        remote.stop()


def test_remote_that_never_starts_is_a_readiness_error_naming_it(tmp_path):
    port = free_port()
    r = subprocess.run(
        [*CLI, "serve", str(write_policy(tmp_path)), "--port", "0", "--device", "cpu", "--tcp",
         "--remote", f"llm=127.0.0.1:{port}", "--startup-timeout", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert "tokenrouter subserver" in r.stderr
    # on a loaded machine the local 'slm' may be late too: it is listed first then
    assert "not ready after 3 s: " in r.stderr and "remote subserver 'llm' (no Ready" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args, status, message",
    [
        (["serve", "{policy}", "--remote", "llm=127.0.0.1:5000"], 2, "--remote needs --tcp"),
        (["serve", "{policy}", "--tcp", "--remote", "llm"], 2, "expected MODEL=HOST:PORT"),
        (["serve", "{policy}", "--tcp", "--bind-host", "0.0.0.0"], 2, "--bind-host"),
        (["serve", "{policy}", "--tcp", "--remote", "xx=127.0.0.1:5000", "--port", "0"], 1, "no such model"),
        (["subserver", "{policy}", "--model", "llm", "--endpoints", "{{nope"], 2, "not valid JSON"),
        (["subserver", "{policy}", "--model", "zzz", "--endpoints", "{eps}"], 1, "no model 'zzz'"),
        (["subserver", "{policy}", "--model", "llm", "--endpoints", "/no/such/file"], 2, "--endpoints"),
        (["subserver", "/no/such.plan", "--model", "llm", "--endpoints", "{eps}"], 1, "no such file"),
    ],
)
def test_bad_remote_usage_is_a_clear_error(tmp_path, args, status, message):
    eps = Endpoints.tcp(["slm", "llm"], "127.0.0.1", free_port()).to_dict()
    fill = {"policy": str(write_policy(tmp_path)), "eps": json.dumps(eps)}
    r = subprocess.run(
        [*CLI, *(a.format(**fill) for a in args)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == status, r.stderr
    assert r.stderr.startswith("error: ") and message in r.stderr and "Traceback" not in r.stderr, r.stderr
