"""Hostile HTTP against a real deployment (tiny models, CPU): every out-of-range field is a 4xx naming it,
slow, cut-off and non-JSON bodies get their own answers, and afterwards the deployment is alive, with no
request left active and every KV page free."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest
from frontend_helpers import Server, wait_all_pages_free, write_policy

BODY_TIMEOUT_S = 1.0
_P = {"prompt": "def f(x):\n", "max_tokens": 4}
_C = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

# (path, fields added to a valid body, the parameter the error names)
HOSTILE = [
    *[("/v1/completions", {"top_k": v}, "top_k") for v in (2**31, 2**63, 2**64, 2**70, -2)],
    *[("/v1/completions", {"seed": v}, "seed") for v in (2**64, -(2**63) - 1, 10**400)],
    *[("/v1/completions", {"stop_token_ids": v}, "stop_token_ids[0]") for v in ([2**64], [2**31], [-1])],
    ("/v1/completions", {"stop_token_ids": list(range(5000))}, "stop_token_ids"),
    *[("/v1/completions", {"max_tokens": v}, "max_tokens") for v in (2**31, 2**64, 0, -1)],
    ("/v1/chat/completions", {"max_completion_tokens": 2**64}, "max_completion_tokens"),
    *[("/v1/completions", {"temperature": v}, "temperature") for v in (-1.0, 101.0, 1e308 * 10, "NaN")],
    *[("/v1/completions", {"top_p": v}, "top_p") for v in (0.0, 2.0, "NaN")],
    ("/v1/completions", {"frequency_penalty": 2.0}, "frequency_penalty"),
    ("/v1/completions", {"presence_penalty": -2.0}, "presence_penalty"),
    ("/v1/completions", {"logit_bias": {"1": 100.0}}, "logit_bias"),
    *[("/v1/completions", {"n": v}, "n") for v in (129, 0, 2**64)],
    *[("/v1/completions", {"prompt": v}, "prompt") for v in ([2**64], [-1], [2**31])],
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    srv = Server(write_policy(tmp), "--body-timeout", str(BODY_TIMEOUT_S), log_dir=tmp)
    yield srv
    srv.stop()


def _body(path: str, fields: dict) -> bytes:
    body = {**(_C if "chat" in path else _P), **fields}
    text = json.dumps(body)  # inf and NaN as JSON's common extensions (Infinity, NaN)
    return text.replace('"NaN"', "NaN").encode()


@pytest.mark.parametrize(("path", "fields", "param"), HOSTILE)
def test_an_out_of_range_field_is_a_400_naming_it(server, path, fields, param):
    r = httpx.post(f"{server.url}{path}", content=_body(path, fields), headers=_JSON, timeout=10)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert "Traceback" not in r.text


_JSON = {"Content-Type": "application/json"}


def _raw(url: str, head: str, body: bytes = b"", wait: float = 10.0) -> tuple[int, dict, float]:
    """Send `head` (and `body`) on a socket; the status, the JSON error and the seconds until the answer."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=wait) as s:
        t0 = time.monotonic()
        s.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        took = time.monotonic() - t0
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1].split(b"\r\n", 1)[-1]), took


def test_a_body_that_stalls_gets_408_within_the_limit(server):
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    promise = f"{1 << 20:x}\r\n".encode() + b'{"prompt":'  # 1 MiB promised, 10 bytes sent
    status, err, took = _raw(server.url, head, promise)
    assert status == 408 and err["error"]["code"] == "request_timeout", err
    assert BODY_TIMEOUT_S <= took < BODY_TIMEOUT_S + 3


def test_a_non_json_post_gets_415(server):
    r = httpx.post(
        f"{server.url}/v1/completions", content=json.dumps(_P), headers={"Content-Type": "text/plain"}
    )
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    ok = httpx.post(
        f"{server.url}/v1/completions",
        content=json.dumps(_P),
        headers={"Content-Type": "application/json; charset=utf-8"},
        timeout=30,
    )
    assert ok.status_code == 200, ok.text


def test_a_client_gone_mid_body_is_a_disconnect_not_an_internal_error(server):
    u = urlsplit(server.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"prompt\": \"abc")  # fmt: skip
        time.sleep(0.3)
    time.sleep(0.5)
    assert "internal error" not in server.stderr() and "Traceback" not in server.stderr(), server.stderr()


def test_the_deployment_lives_on_with_no_request_left(server):
    """Runs last: after all of the above, the server answers, nothing is active and the KV pools are free."""
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    r = httpx.post(f"{server.url}/v1/completions", json=_P, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
    wait_all_pages_free(server.url, ["slm", "llm"])
    assert "Traceback" not in server.stderr() and "failed" not in server.stderr(), server.stderr()
