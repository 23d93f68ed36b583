"""Every mode serves the OpenAI API: `tokenrouter serve PLAN --mode MODE` on the tiny models (all six
deployments started at once, to keep the test short). The same greedy requests (same seeds) get the same
tokens and per-token model traces in every mode but llm-only, which writes every token on the large
model; std-serving's prefix counters reach /metrics."""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
MODES = ("tokenrouter", "llm-only", "lockstep", "std-serving", "eager", "no-graphs")
POLICY = """\
policy modes_test
model slm = "{root}/examples/models/tiny-small" {{ gpu: 0, batch: 2 }}
model llm = "{root}/examples/models/tiny-large" {{ gpu: 0, batch: 2 }}
serve {{ concurrency: 4, max_delay_ms: 5 }}
entry slm
route slm {{ when uniform() < 0.3 -> llm }}
route llm {{ when uniform() < 0.6 -> slm }}
"""
EXTRA = {
    "llm-only": ["--cpu-threads", "1", "--log-level", "info"],  # the one-model deployment: default 2 here
    "lockstep": ["--profile-dir"],  # + a folder (_start)
}
PROMPTS = [[5 + (7 * i + 3 * j) % 400 for j in range(18 + 3 * i)] for i in range(4)]  # > 1 cache block (16)


def _start(
    plan: Path, mode: str, log_dir: Path, extra: tuple[str, ...] = (), name: str | None = None
) -> tuple[subprocess.Popen, object]:
    err = open(log_dir / f"{name or mode}.stderr", "w")  # noqa: SIM115 - closed in the fixture
    cmd = [sys.executable, "-m", "tokenrouter.cli", "serve", str(plan), "--mode", mode, "--port", "0"]
    proc = subprocess.Popen(
        [
            *cmd,
            "--device",
            "cpu",
            *(x if x != "--profile-dir" else f"--profile-dir={log_dir / mode}" for x in EXTRA.get(mode, [])),
            *extra,
        ],  # fmt: skip
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        start_new_session=True,
    )
    return proc, err


def _url(proc: subprocess.Popen, deadline: float) -> str | None:
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if found := re.search(r"http://\S+", line):
                return found.group(0)
            if not line:
                return None
        elif proc.poll() is not None:
            return None
    return None


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("modes")


@pytest.fixture(scope="module")
def servers(log_dir):
    tmp = log_dir
    plan = tmp / "modes_test.tr"
    plan.write_text(POLICY.format(root=ROOT))
    started = {mode: _start(plan, mode, tmp) for mode in MODES}
    deadline = time.monotonic() + 240
    urls = {mode: _url(proc, deadline) for mode, (proc, _) in started.items()}
    try:
        failed = [mode for mode, url in urls.items() if url is None]
        if failed:
            logs = "\n".join((tmp / f"{x}.stderr").read_text()[-2000:] for x in failed)
            pytest.fail(f"modes {failed} did not start:\n{logs}")
        yield urls
    finally:
        for proc, _ in started.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        for mode, (proc, err) in started.items():
            assert proc.wait(30) == 0, f"{mode} did not exit cleanly"
            err.close()
            proc.stdout.close()


async def _complete(url: str) -> list[dict]:
    async with httpx.AsyncClient(timeout=60) as client:
        bodies = [
            {
                "prompt": p,
                "max_tokens": 12,
                "temperature": 0,
                "seed": 100 + i,
                "ignore_eos": True,
                "return_routing_trace": True,
            }  # fmt: skip
            for i, p in enumerate(PROMPTS)
        ]
        rs = await asyncio.gather(*(client.post(f"{url}/v1/completions", json=b) for b in bodies))
    for r in rs:
        assert r.status_code == 200, r.text
    return [r.json()["choices"][0] for r in rs]


def _tokens(choice: dict) -> tuple[str, list[str]]:
    return choice["text"], choice["routing"]["trace"]


def test_every_mode_answers_with_tokenrouters_tokens(servers):
    got = {mode: asyncio.run(_complete(url)) for mode, url in servers.items()}
    want = [_tokens(c) for c in got["tokenrouter"]]
    assert any("llm" in trace for _, trace in want) and any("slm" in trace for _, trace in want)
    for mode in ("lockstep", "std-serving", "eager", "no-graphs"):
        assert [_tokens(c) for c in got[mode]] == want, mode
    for c in got["llm-only"]:
        assert c["routing"]["trace"] == ["llm"] * 12 and c["routing"]["hops"] == 0
    models = httpx.get(f"{servers['llm-only']}/server_info", timeout=10).json()["models"]
    assert models == ["llm"]


def test_every_mode_scores_the_prompt_on_its_entry_model(servers):
    body = {"prompt": PROMPTS[0], "max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 2}
    got = {}
    for mode, url in servers.items():
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, (mode, r.text)
        got[mode] = r.json()["choices"][0]
    for mode, c in got.items():
        entry = "llm" if mode == "llm-only" else "slm"
        assert c["routing"]["prompt_logprobs_from"] == entry, mode
        lp = c["logprobs"]
        assert len(lp["tokens"]) == len(PROMPTS[0]) + 2 and lp["token_logprobs"][0] is None, mode
    want = got["tokenrouter"]["logprobs"]["token_logprobs"][1:-2]
    for mode in ("lockstep", "std-serving", "eager", "no-graphs"):
        assert got[mode]["logprobs"]["token_logprobs"][1:-2] == pytest.approx(want, abs=1e-5), mode
    assert got["llm-only"]["logprobs"]["token_logprobs"][1:-2] != pytest.approx(want, abs=1e-3)


def test_std_serving_reports_prefix_reuse(servers):
    url = servers["std-serving"]
    asyncio.run(_complete(url))
    deadline = time.monotonic() + 10
    while True:  # subservers report stats every 0.5 s
        text = httpx.get(f"{url}/metrics", timeout=10).text
        matched = sum(
            float(v) for v in re.findall(r"^tokenrouter_prefix_matched_tokens\{.*\} (\S+)$", text, re.M)
        )
        computed = sum(
            float(v) for v in re.findall(r"^tokenrouter_prefix_computed_tokens\{.*\} (\S+)$", text, re.M)
        )
        if matched > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert matched > 0 and computed > 0


def test_cpu_threads_reaches_the_subserver(servers, log_dir):
    """`--cpu-threads 1` on the llm-only deployment, whose one model would take both cores here."""
    assert servers["llm-only"]
    assert "model llm: 1 torch thread(s)" in (log_dir / "llm-only.stderr").read_text()


def test_the_lockstep_process_writes_one_profile_of_every_model(servers, log_dir):
    """The lockstep baseline holds every model in one process: one trace answers for both; a server started
    without --profile-dir says how to turn profiling on."""
    url = servers["lockstep"]
    assert httpx.post(f"{url}/start_profile", timeout=60).status_code == 200
    asyncio.run(_complete(url))
    files = httpx.post(f"{url}/stop_profile", timeout=120).json()["files"]
    assert files["slm"] == files["llm"] and os.path.exists(files["slm"][0])
    assert os.path.dirname(files["slm"][0]) == str(log_dir / "lockstep")
    off = httpx.post(f"{servers['tokenrouter']}/start_profile", timeout=10)
    assert off.status_code == 400
    assert off.json()["error"]["message"] == "profiling is off: start the server with --profile-dir DIR"
