"""The prefix cache over HTTP: `tokenrouter serve` with the cache and with `--no-prefix-cache` answer the openai
client's greedy requests with the same text and routing traces, the same prompts sent again included (their
first hop to the other model then finds the sequence cached there); /metrics says which deployment caches and
how much it matched; and `tokenrouter bench`'s conversation and shared-prefix loads report TTFT by turn and the
hit rate per model."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import time

import httpx
import pytest
from test_modes_serve import POLICY, ROOT, _start, _url

from tokenrouter.loadgen.bench import LoadSpec, format_report, run_load

SYSTEM = [5 + (11 * j) % 300 for j in range(40)]  # two and a half blocks of 16
PROMPTS = [SYSTEM + [7 + (5 * i + 3 * j) % 300 for j in range(3 + i)] for i in range(4)]


@pytest.fixture(scope="module")
def deployments(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prefix")
    plan = tmp / "modes_test.tr"
    plan.write_text(POLICY.format(root=ROOT))
    started = {
        "on": _start(plan, "tokenrouter", tmp, name="on"),
        "off": _start(plan, "tokenrouter", tmp, ("--no-prefix-cache",), name="off"),
    }
    deadline = time.monotonic() + 240
    urls = {k: _url(proc, deadline) for k, (proc, _) in started.items()}
    try:
        if None in urls.values():
            logs = "\n".join((tmp / f"{k}.stderr").read_text()[-2000:] for k in started)
            pytest.fail(f"a deployment did not start: {urls}\n{logs}")
        yield urls
    finally:
        for proc, _ in started.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        for proc, err in started.values():
            assert proc.wait(30) == 0
            err.close()
            proc.stdout.close()


def _answers(url: str) -> list[tuple[str, list[str]]]:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=60)
    out = []
    for _ in range(2):  # the second time, every prompt (and what its first round generated) is cached
        for i, p in enumerate(PROMPTS):
            r = client.completions.create(model="modes_test", prompt=p, max_tokens=12, temperature=0, seed=100 + i,
                                          extra_body={"ignore_eos": True, "return_routing_trace": True})  # fmt: skip
            choice = r.choices[0]
            out.append((choice.text, choice.routing["trace"]))
    return out


def _gauges(url: str, name: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {m: float(v) for m, v in re.findall(rf'^tokenrouter_{name}\{{model="(\w+)"\}} (\S+)$', text, re.M)}


def test_same_answers_with_and_without_the_cache(deployments):
    on, off = _answers(deployments["on"]), _answers(deployments["off"])
    assert on == off
    assert any("llm" in trace for _, trace in on)
    time.sleep(1.2)  # the subservers' next stats
    assert _gauges(deployments["on"], "prefix_cache_enabled") == {"llm": 1.0, "slm": 1.0}
    assert _gauges(deployments["off"], "prefix_cache_enabled") == {"llm": 0.0, "slm": 0.0}
    matched = _gauges(deployments["on"], "prefix_matched_tokens")
    assert matched["slm"] >= 3 * 32 + 4 * 32 and matched["llm"] > 0  # first arrivals on llm matched too
    assert sum(_gauges(deployments["off"], "prefix_matched_tokens").values()) == 0


def test_bench_conversations_and_shared_prefix(deployments):
    url = deployments["on"]
    chat = LoadSpec(url=url, concurrency=2, num_prompts=2, turns=3, system_len=40, prompt_len=4, output_len=6,
                    progress=False)  # fmt: skip
    report = asyncio.run(run_load(chat))
    assert report["completed"] == 6 and set(report["ttft_ms_by_turn"]) == {"1", "2", "3"}
    assert report["prefix_cache"]["slm"]["enabled"] and report["prefix_cache"]["slm"]["hit_rate"] > 0.5
    turns = [(r["conversation"], r["turn"]) for r in report["per_request"]]
    assert sorted(turns) == [(c, t) for c in range(2) for t in (1, 2, 3)]
    text = format_report(report)
    assert "TTFT of turn 3" in text and "prefix cache hits on slm" in text
    # each model's steps during the measured run only: 6 answers of 6 tokens, the slm writes most of them
    slm = report["steps_by_model"]["slm"]
    assert 6 <= slm["steps"] <= report["tokens_per_model"]["slm"] + 6 and slm["ms_per_step"] > 0
    assert slm["tokens_per_step"] >= slm["rows_per_step"] >= 1 and 0 < slm["busy"] <= 1
    assert "steps of slm" in text
    shared = LoadSpec(url=url, concurrency=2, num_prompts=6, shared_prefix_len=48, prefix_groups=2, prompt_len=3,
                      output_len=4, progress=False)  # fmt: skip
    report = asyncio.run(run_load(shared))
    assert report["completed"] == 6 and report["prefix_cache"]["slm"]["matched_tokens"] >= 4 * 48
    off = asyncio.run(run_load(dataclasses.replace(shared, url=deployments["off"])))
    assert not off["prefix_cache"]["slm"]["enabled"]
    assert re.search(r"prefix cache hits on slm +\| off", format_report(off))
