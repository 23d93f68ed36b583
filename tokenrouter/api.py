"""The Python API: `tokenrouter.Engine(plan_or_policy, **overrides)` runs what `tokenrouter serve` runs (a
launcher, the frontend, one subserver process per model) on a private port with a random API key, and
talks to it over HTTP. `generate` takes a batch and returns texts, token ids and routing traces; `stream` is
the async streaming form. The processes start on construction and stop on `close()`, at the end of a `with`
block, or at interpreter exit."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import http.client
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

STOP_TIMEOUT_S = 30.0  # after SIGINT, the launcher's own shutdown; then its process group is killed
_CHILD = (
    "import json, sys\n"
    "from tokenrouter.runtime.launcher import ServeConfig, serve\n"
    "sys.exit(serve(ServeConfig(**json.loads(sys.argv[1]))))\n"
)


class EngineError(Exception):
    """The engine did not start, or a request failed; the message says why (the server's own words)."""


@dataclass(slots=True)
class Sampling:
    """Sampling settings of a `generate` or `stream` call, with the HTTP API's defaults and meaning
    (docs/serving.md, "Request fields"): temperature 0 is greedy; `seed` None draws one per request. `n`
    completions per prompt, the j-th seeded `seed + j` (each equals a call of its own with that seed).
    `logprobs`: each token's log-probability from the model that wrote it, with the `top_logprobs` most likely
    tokens' (0 to 20). `prompt_logprobs`: each prompt token's log-probability given the tokens before it, from
    the entry model, which scores every prompt (the HTTP API's `echo`; `generate` only, and `max_tokens` may be
    0), with the `top_logprobs` most likely. `route_inputs`: each token's route decisions with what they read
    (`routing.inputs`, docs/serving.md)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    route_inputs: bool = False
    prompt_logprobs: bool = False
    # structured output, as the HTTP API's (docs/serving.md, "Structured output and tools"): e.g.
    # {"type": "json_schema", "json_schema": {"name": "x", "schema": {...}}}
    response_format: dict | None = None

    def __post_init__(self) -> None:
        if self.top_logprobs and not (self.logprobs or self.prompt_logprobs):
            raise ValueError("Sampling: top_logprobs needs logprobs=True or prompt_logprobs=True")

    def body(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        del out["logprobs"], out["top_logprobs"], out["route_inputs"], out["prompt_logprobs"]
        if self.route_inputs:
            out["return_route_inputs"] = True
        if self.logprobs or self.prompt_logprobs:  # the completions API's `logprobs: K`, tokens named by id
            out.update(logprobs=self.top_logprobs, return_tokens_as_token_ids=True)
        if self.prompt_logprobs:
            out["echo"] = True
        return {**out, "return_routing_trace": True, "return_token_ids": True}


@dataclass(slots=True)
class TokenLogprob:
    """One token's log-probability under the model that wrote it (the log-softmax of the logits it was
    sampled from, before temperature, top-k and top-p), and the most likely tokens' there, most likely first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class Generation:
    """One completion: its text, token ids, the model that wrote each token (`trace`), and why it stopped
    (`"stop"`: EOS, a stop string or token; `"length"`: max_tokens or the context); `logprobs` per token
    with `Sampling(logprobs=True)`, else None; `route_inputs` per token with `Sampling(route_inputs=True)`: the
    route decisions that led to it, `{"model", "values", "to"?, "dropped"?}` (docs/serving.md)."""

    text: str
    token_ids: list[int]
    trace: list[str]
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None = None
    route_inputs: list[list[dict]] | None = None
    # with Sampling(prompt_logprobs=True): per prompt token, from the entry model (the first token: None)
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass(slots=True)
class Delta:
    """A piece of a streamed completion (`index`: which of the `n`): its text, and with `Sampling(logprobs=
    True)` its tokens' logprobs. The last one of each completion has `finish_reason` and the whole
    `token_ids`, `trace` and `logprobs`, with `text` empty."""

    text: str
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    trace: list[str] | None = None
    index: int = 0
    logprobs: list[TokenLogprob] | None = None


def _settings(plan_or_policy: str | os.PathLike, key: str, startup_timeout_s: float, overrides: dict) -> dict:
    """`serve`'s settings for an Engine (as ServeConfig's keyword arguments), checked by ServeConfig here, as
    errors of the Engine's call: TypeError for a setting that is the engine's own or unknown."""
    from tokenrouter.runtime.launcher import ServeConfig

    for own in ("plan", "port", "api_key", "host"):
        if own in overrides:
            raise TypeError(f"Engine: {own!r} is set by the engine, not by an override")
    known = {f.name for f in dataclasses.fields(ServeConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"Engine: unknown setting {unknown[0]!r}; settings are {', '.join(sorted(known))}")
    settings = {"plan": str(plan_or_policy), "port": 0, "api_key": key, **overrides}
    settings["startup_timeout_s"] = startup_timeout_s
    ServeConfig(**settings)  # its checks, here, as errors of this call
    return settings


class Engine:
    """`Engine("examples/bernoulli.tr", device="cpu")`: `overrides` are `tokenrouter serve`'s settings as
    keyword arguments (`ServeConfig`: `device`, `defines`, `mode`, `batch`, `log_level`, ...; `port` and
    `api_key` are the engine's own)."""

    def __init__(self, plan_or_policy: str | os.PathLike, *, startup_timeout_s: float = 600.0, **overrides):
        self._key = secrets.token_hex(16)
        settings = _settings(plan_or_policy, self._key, startup_timeout_s, overrides)
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in close()
        self._proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-c", _CHILD, json.dumps(settings)],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            start_new_session=True,  # its own process group: close() can stop every process it started
        )
        atexit.register(self.close)
        try:
            deadline = time.monotonic() + startup_timeout_s + 10
            self.url = self._read_url(deadline)
            parts = urlsplit(self.url)
            self._host, self._port = parts.hostname, parts.port
            self._wait_healthy(deadline)
        except BaseException:
            self.close()
            raise

    # ---- life cycle ------------------------------------------------------------------------------------
    def _read_url(self, deadline: float) -> str:
        """The one line `serve` prints on stdout once every process is ready: `... at http://HOST:PORT`."""
        proc = self._proc
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line = proc.stdout.readline()
                if line and " at http" in line:
                    return line.rsplit(" at ", 1)[1].strip()
                if not line and proc.poll() is not None:
                    break
            elif proc.poll() is not None:
                break
        raise EngineError(f"the engine did not start: {self._stderr_tail() or 'no message'}")

    def _wait_healthy(self, deadline: float) -> None:
        """Until GET /health answers 200: the frontend has every model's Ready (it may lag the printed line)."""
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=5)
            try:
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        raise EngineError(f"the engine did not become healthy: {self._stderr_tail() or 'no message'}")

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        lines = [x for x in self._stderr.read().splitlines() if x.strip()]
        errors = [x for x in lines if x.startswith("error:")]
        return "\n".join(errors or lines[-5:])

    def close(self) -> None:
        """Stop every process of the engine (SIGINT to the launcher, as Ctrl-C; killed if it lingers)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        atexit.unregister(self.close)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        proc.stdout.close()
        self._stderr.close()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- requests --------------------------------------------------------------------------------------
    def _request(self, body: dict) -> http.client.HTTPResponse:
        if self._proc is None:
            raise EngineError("the engine is closed")
        conn = http.client.HTTPConnection(self._host, self._port)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self._key}"}
        conn.request("POST", "/v1/completions", json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise EngineError(_error_text(resp.read()))
        return resp

    def generate(
        self, prompts: str | Sequence[int] | Sequence[str | Sequence[int]], sampling: Sampling | None = None
    ) -> list[Generation]:
        """`n` Generations per prompt, in order: prompt i's j-th at `i * n + j`. A prompt is text (the entry
        model's tokenizer) or token ids; the batch runs concurrently, as concurrent requests to `serve` do."""
        batch = _batch(prompts)
        sampling = sampling or Sampling()
        data = json.loads(self._request({**sampling.body(), "prompt": batch}).read())
        out = []
        for c in sorted(data["choices"], key=lambda c: c["index"]):
            r = c["routing"]
            lp = _logprobs(c.get("logprobs"))
            g = Generation(c["text"], r["token_ids"], r["trace"], c["finish_reason"], lp, r.get("inputs"))
            if sampling.prompt_logprobs:
                _split_echo(g, c["logprobs"]["text_offset"], sampling.logprobs)
            out.append(g)
        return out

    async def stream(
        self, prompt: str | Sequence[int], sampling: Sampling | None = None
    ) -> AsyncIterator[Delta]:
        """The completions of one prompt as they are written: Deltas of text, then for each of the `n` a last
        Delta with `finish_reason`, the token ids, the routing trace and the logprobs. With `n` > 1 the
        completions' Deltas interleave; `index` tells them apart."""
        if sampling is not None and sampling.prompt_logprobs:
            raise ValueError("stream: prompt_logprobs is for generate (the server does not stream echo)")
        body = {**(sampling or Sampling()).body(), "prompt": _batch(prompt)[0], "stream": True}
        resp = await asyncio.to_thread(self._request, body)
        logprobs: dict[int, list[TokenLogprob]] = {}  # per completion, its logprobs so far
        try:
            while True:
                line = await asyncio.to_thread(resp.readline)
                if not line:
                    raise EngineError("the stream ended before [DONE]")
                line = line.decode().strip()
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: ") :]
                if payload == "[DONE]":
                    return
                for delta in _deltas(json.loads(payload), logprobs):
                    yield delta
        finally:
            resp.close()


def _deltas(event: dict, logprobs: dict[int, list[TokenLogprob]]) -> list[Delta]:
    """The Deltas of one server-sent event: each choice's text (with its tokens' logprobs, also gathered per
    completion in `logprobs`), or its last Delta (an error raises)."""
    if "error" in event:
        raise EngineError(event["error"].get("message", "the request failed"))
    out = []
    for c in event.get("choices", ()):
        i, lp = c["index"], _logprobs(c.get("logprobs"))
        if lp is not None:
            logprobs.setdefault(i, []).extend(lp)
        if c.get("finish_reason") is None:
            if c["text"] or lp:
                out.append(Delta(c["text"], index=i, logprobs=lp))
        else:
            r = c["routing"]
            whole = logprobs.get(i, []) if lp is not None else None
            out.append(Delta(c["text"], c["finish_reason"], r["token_ids"], r["trace"], i, whole))
    return out


def _batch(prompts: Any) -> list:
    """The HTTP API's `prompt` for a batch: all texts, or all token-id lists."""
    if isinstance(prompts, str) or (
        isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)
    ):
        prompts = [prompts]
    prompts = [p if isinstance(p, str) else list(p) for p in prompts]
    if not prompts:
        raise ValueError("generate: no prompts")
    if not (all(isinstance(p, str) for p in prompts) or all(isinstance(p, list) for p in prompts)):
        raise ValueError("generate: give every prompt as text, or every prompt as token ids")
    return prompts


def _split_echo(g: Generation, offsets: list[int], logprobs: bool) -> None:
    """An echoed choice as the prompt's logprobs and the completion's text and logprobs (each token's
    `text_offset` counts from the start of the prompt's text: the completion's first one is its end)."""
    whole, n_gen = g.logprobs or [], len(g.token_ids)
    n = len(whole) - n_gen
    g.prompt_logprobs = whole[:n]
    g.logprobs = whole[n:] if logprobs else None
    g.text = g.text[offsets[n] :] if n_gen else ""


def _logprobs(lp: dict | None) -> list[TokenLogprob] | None:
    """A choice's completions-shaped `logprobs` with tokens named `token_id:N` (`return_tokens_as_token_ids`)."""
    if lp is None:
        return None

    def tid(name: str) -> int:
        return int(name.removeprefix("token_id:"))

    return [  # an echoed prompt's first token has none
        None if v is None else TokenLogprob(tid(t), v, [(tid(k), x) for k, x in top.items()])
        for t, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True)
    ]


def _error_text(raw: bytes) -> str:
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw.decode(errors="replace")[:500]


__all__ = ["Delta", "Engine", "EngineError", "Generation", "Sampling", "TokenLogprob"]
