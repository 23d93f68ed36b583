"""`gpus: [0, 1]` served on CPU: the model runs as two gloo ranks, gives the tokens and routing trace of the same
policy on one rank, and a rank killed mid-run fails the requests with a 5xx and ends the deployment."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
from frontend_helpers import Server, write_policy

PROMPTS = ["def add(a, b):", "class Stack:", "for i in range(10):"]


def tp_policy(folder: Path, gpus: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = write_policy(folder)
    path.write_text(path.read_text().replace("{ gpu: 0, batch: 1 }", f"{{ gpus: {gpus}, batch: 1 }}"))
    assert f"gpus: {gpus}" in path.read_text()
    return path


def completions(url: str) -> list[tuple[str, list[str]]]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    out = []
    for seed, prompt in enumerate(PROMPTS):
        r = client.completions.create(model="testmix", prompt=prompt, max_tokens=12, temperature=0, seed=seed,
                                      extra_body={"ignore_eos": True, "return_routing_trace": True})  # fmt: skip
        out.append((r.choices[0].text, r.choices[0].model_extra["routing"]["trace"]))
    return out


def follower_pids(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children]


def test_two_ranks_serve_the_tokens_and_trace_of_one(tmp_path):
    plans = [tp_policy(tmp_path / "tp1", "[0]"), tp_policy(tmp_path / "tp2", "[0, 1]")]
    with ThreadPoolExecutor(2) as pool:  # both deployments start at once
        servers = list(pool.map(lambda p: Server(p, log_dir=p.parent), plans))
    try:
        info = httpx.get(f"{servers[1].url}/server_info", timeout=10).json()
        assert len(follower_pids(info["subservers"]["llm"]["pid"])) == 1  # rank 1 of the two
        one, two = (completions(s.url) for s in servers)
        assert two == one
        assert any("llm" in trace for _, trace in two) and any("slm" in trace for _, trace in two)
    finally:
        for s in servers:
            s.stop()


def test_a_killed_rank_fails_requests_and_the_server_exits(tmp_path):
    srv = Server(tp_policy(tmp_path, "[0, 1]"), log_dir=tmp_path)
    try:
        info = httpx.get(f"{srv.url}/server_info", timeout=10).json()
        (rank1,) = follower_pids(info["subservers"]["llm"]["pid"])
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=60)
        results: list[str] = []

        def request(i: int) -> None:
            try:
                client.completions.create(model="testmix", prompt=PROMPTS[i], max_tokens=3000,
                                          extra_body={"ignore_eos": True})  # fmt: skip
                results.append("no error")
            except openai.APIStatusError as e:
                results.append(f"{e.status_code} {e}")

        threads = [threading.Thread(target=request, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        os.kill(rank1, signal.SIGKILL)
        killed = time.monotonic()
        for t in threads:
            t.join(30)
        assert len(results) == 3, results
        assert all(r[:3].isdigit() and int(r[:3]) >= 500 and "subserver 'llm'" in r for r in results), results
        assert time.monotonic() - killed < 15
        assert srv.wait(30) == 1
        assert "tensor-parallel rank 1 of 2" in srv.stderr(), srv.stderr()
    finally:
        srv.stop()
