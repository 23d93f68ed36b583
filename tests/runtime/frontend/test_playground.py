"""The playground page (`GET /`) and `GET /v1/stats` against a real `tokenrouter serve` (tiny models, CPU, with an
API key), and the page itself in a headless Chromium (skipped where none is installed)."""

from __future__ import annotations

import json
import re
import signal
import time

import httpx
import pytest
from cdp import Browser, find_chromium
from frontend_helpers import Server, write_policy

from tokenrouter.runtime.frontend.config import FrontendArgs
from tokenrouter.runtime.frontend.metrics import Metrics
from tokenrouter.runtime.frontend.playground import stats

KEY = "sk-playground"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = [{"role": "user", "content": "Write a function that adds two numbers."}]
SETTINGS = {"max_tokens": 16, "temperature": 0, "seed": 5, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("playground")
    srv = Server(write_policy(tmp), "--api-key", KEY, log_dir=tmp)
    yield srv
    srv.stop(signal.SIGINT)


def test_stats_snapshot_from_the_metrics():
    args = FrontendArgs(policy="p", entry="a", models=["a", "b"], model_dir=".",
                        endpoints={"frontend": "x", "launcher": "y", "subservers": {"a": "1", "b": "2"}})  # fmt: skip
    met = Metrics(models=["a", "b"])
    met.tokens["a"] += 5
    met.hops[("a", "b")] += 2
    out = stats(met, 3, args)
    assert out["generation_tokens"] == {"a": 5, "b": 0} and out["hops"] == 2 and out["requests_active"] == 3
    assert out["models"] == ["a", "b"] and out["subservers"] == {}
    json.dumps(out)


def test_the_page_loads_without_the_key_and_needs_nothing_from_outside(server):
    r = httpx.get(f"{server.url}/", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<meta name="tokenrouter-auth" content="key">' in r.text
    assert "http://" not in r.text and "https://" not in r.text  # no CDN: it works offline
    assert httpx.get(f"{server.url}/v1/stats", timeout=10).status_code == 401


def test_stats_endpoint(server):
    httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=60,
               json={"prompt": "x = [", **SETTINGS}).raise_for_status()  # fmt: skip
    deadline = time.monotonic() + 10
    while True:  # each subserver reports its stats every 0.5 s
        s = httpx.get(f"{server.url}/v1/stats", headers=AUTH, timeout=10).json()
        if (
            all(s["subservers"].get(x, {}).get("steps") for x in ("slm", "llm"))
            or time.monotonic() > deadline
        ):
            break
        time.sleep(0.2)
    assert s["object"] == "stats" and s["policy"] == "testmix" and s["models"] == ["slm", "llm"]
    assert sum(s["generation_tokens"].values()) >= 16 and s["requests_active"] == 0
    for x in ("slm", "llm"):
        sub = s["subservers"][x]
        assert sub["steps"] > 0 and sub["rows_total"] >= sub["steps"] and sub["pending"] >= 0


def test_profile_reads_the_stats_document_of_a_live_server(server, monkeypatch):
    """`profile --from-metrics URL`'s reader (`from_metrics.read_source`): the server's /v1/stats with the key in
    TOKENROUTER_API_KEY, its counters read by the throughput side; without the key, a message that says so."""
    from tokenrouter.throughput.from_metrics import MetricsProfileError, read_counters, read_source

    httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=60,
               json={"prompt": "y = (", **SETTINGS}).raise_for_status()  # fmt: skip
    monkeypatch.delenv("TOKENROUTER_API_KEY", raising=False)
    with pytest.raises(MetricsProfileError, match=r"/v1/stats: HTTP 401 \(set TOKENROUTER_API_KEY"):
        read_source(server.url)
    monkeypatch.setenv("TOKENROUTER_API_KEY", KEY)
    deadline = time.monotonic() + 10
    while True:  # each subserver reports its stats every 0.5 s
        counters = read_counters(read_source(server.url + "/"))
        if all(counters.models.get(x) and counters.models[x].by_bs for x in ("slm", "llm")):
            break
        assert time.monotonic() < deadline, counters
        time.sleep(0.2)
    assert counters.named == {"slm", "llm"} and sum(counters.tokens.values()) >= 16
    assert counters.plan["policy"] == "testmix" and counters.counts_first
    assert sum(n for c in counters.models.values() for n, _ in c.by_bs.values()) > 0


def test_streamed_chunks_carry_the_routing_of_their_tokens(server):
    body = {"prompt": "def add(a, b):", "stream": True, "return_routing_trace": True, **SETTINGS}
    text, trace, pieces, final = "", [], [], None
    with httpx.stream("POST", f"{server.url}/v1/completions", headers=AUTH, json=body, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            (c,) = json.loads(line[6:])["choices"]
            if c["finish_reason"]:
                final = c["routing"]
                continue
            text += c["text"]
            assert c["text"] == "".join(c["routing"]["pieces"])
            trace += c["routing"]["trace"]
            pieces += c["routing"]["pieces"]
    assert final is not None and trace == final["trace"] and len(trace) == 16
    full = httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=60,
                      json={**body, "stream": False}).json()["choices"][0]  # fmt: skip
    assert text == full["text"] == "".join(pieces) and full["routing"]["trace"] == trace


def test_the_page_in_a_browser(server):
    exe = find_chromium()
    if exe is None:
        pytest.skip("no chromium installed (apt-get install chromium)")
    expected = httpx.post(f"{server.url}/v1/chat/completions", headers=AUTH, timeout=60,
                          json={"messages": CHAT, "return_routing_trace": True, **SETTINGS}).json()  # fmt: skip
    trace = expected["choices"][0]["routing"]["trace"]
    assert {"slm", "llm"} <= set(trace)  # both models wrote: the colours tell them apart
    b = Browser(exe)
    try:
        b.goto(f"{server.url}/")
        b.wait_for("!document.getElementById('keybox').classList.contains('hidden')")  # it asks for the key
        b.evaluate(
            f"document.getElementById('key').value = {KEY!r}; document.getElementById('usekey').click()"
        )
        b.wait_for("document.body.dataset.ready === '1'")
        legend = b.evaluate(
            "Object.fromEntries([...document.querySelectorAll('#legend .sw')]"
            ".map(s => [s.dataset.model, getComputedStyle(s).backgroundColor]))"
        )
        assert set(legend) == {"slm", "llm"} and len(set(legend.values())) == 2

        # a chat answer, greedy with the same seed as the API request: the same tokens, coloured by its trace
        for field, value in SETTINGS.items():
            if field == "ignore_eos":
                b.evaluate(f"document.getElementById('ignore_eos').checked = {str(value).lower()}")
            else:
                b.evaluate(f"document.getElementById({field!r}).value = {json.dumps(str(value))}")
        b.evaluate(f"document.getElementById('prompt').value = {CHAT[0]['content']!r};"
                   "document.getElementById('send').click()")  # fmt: skip
        b.wait_for("document.body.dataset.done === '1'", timeout=60)
        toks = b.evaluate(
            "[...document.querySelectorAll('.answer .tok')].map(s => [s.dataset.model, s.textContent,"
            " getComputedStyle(s).borderBottomColor, s.classList.contains('hop')])"
        )
        assert [t[0] for t in toks] == trace
        assert "".join(t[1] for t in toks) == expected["choices"][0]["message"]["content"]
        assert all(color == legend[model] for model, _, color, _ in toks)
        hops = [i for i in range(1, len(trace)) if trace[i] != trace[i - 1]]
        assert [i for i, t in enumerate(toks) if t[3]] == hops
        counts = b.evaluate("document.getElementById('counts').innerText")
        for model, n in expected["choices"][0]["routing"]["tokens_per_model"].items():
            assert f"{model}\t{n}\t" in counts

        # the switch: the same answer again, each token with its route decisions' inputs (testmix reads
        # uniform() on both models), shown in the panel when pointed at
        asked = httpx.post(f"{server.url}/v1/chat/completions", headers=AUTH, timeout=60,
                           json={"messages": CHAT, "return_routing_trace": True, "return_route_inputs": True,
                                 **SETTINGS}).json()["choices"][0]["routing"]  # fmt: skip
        assert asked["trace"] == trace and all(
            d["values"].keys() == {"uniform"} for x in asked["inputs"] for d in x
        )
        assert b.evaluate("[...document.querySelectorAll('.tok')].every(s => s.dataset.inputs === undefined)")
        b.evaluate("document.getElementById('clear').click(); document.getElementById('route_inputs').click();"
                   "document.getElementById('send').click()")  # fmt: skip
        b.wait_for("document.body.dataset.done === '2'", timeout=60)
        shown = b.evaluate("[...document.querySelectorAll('.answer .tok')].map(s => [s.dataset.model,"
                           " JSON.parse(s.dataset.inputs)])")  # fmt: skip
        assert [x[0] for x in shown] == trace and [x[1] for x in shown] == asked["inputs"]
        assert b.evaluate("document.getElementById('why').classList.contains('hidden')")
        b.evaluate("document.querySelectorAll('.answer .tok')[3].dispatchEvent(new MouseEvent('mouseenter'))")
        why = b.evaluate("document.getElementById('why').innerText")
        lines = why.splitlines()
        assert lines[0].endswith(f"by {trace[3]}") and len(lines) == 1 + len(asked["inputs"][3])
        for line, d in zip(lines[1:], asked["inputs"][3], strict=True):
            value = float(re.search(r"uniform = ([-+.e0-9]+)", line).group(1))
            assert line.startswith(f"{d['model']}: ")
            assert value == pytest.approx(d["values"]["uniform"], rel=1e-3)
            # the model's rules beside, the threshold as its value (testmix: slm < 0.3 -> llm, llm < 0.7 -> slm)
            assert line.endswith(
                {"slm": "[when uniform() < 0.3 -> llm]", "llm": "[when uniform() < 0.7 -> slm]"}[d["model"]]
            )
        assert "to " in why or "stay" in why
        b.evaluate("document.getElementById('route_inputs').click()")  # off: the panel goes
        assert b.evaluate("document.getElementById('why').classList.contains('hidden')")

        # the live charts draw from /v1/stats every second
        b.evaluate("document.getElementById('tab-stats').click()")
        b.wait_for(
            "[...document.querySelectorAll('#charts svg')].every(s => "
            "s.querySelectorAll('polyline').length > 0 && "
            "[...s.querySelectorAll('polyline')].every(p => p.getAttribute('points').split(' ').length >= 2))",
            timeout=15,
        )
        assert b.errors == []

        # a wrong key is refused, with a message that says so
        b.evaluate("sessionStorage.setItem('tokenrouter-api-key', 'wrong'); location.reload()")
        b.wait_for("document.readyState === 'complete' && "
                   "document.getElementById('keywhy').textContent.startsWith('Wrong API key')")  # fmt: skip
        assert b.evaluate("document.body.dataset.ready") is None
    finally:
        b.close()
