"""The load generator's own logic: prompts, percentiles, SSE parsing and the report.

The client is exercised here against a minimal scripted SSE endpoint (so that its parsing and arithmetic are
checked on known numbers); runs against the real TokenRouter server live with the runtime's tests.
"""

import asyncio
import json
import re
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from tokenrouter.loadgen.bench import LoadSpec, _percentile, format_report, make_prompts, run_load


def test_percentile_interpolates():
    assert _percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert _percentile([5.0], 0.99) == 5.0


def test_synthetic_prompts_are_deterministic_and_in_range():
    spec = LoadSpec(num_prompts=3, prompt_len=5, seed=7, vocab_low=10, vocab_high=20)
    a, b = make_prompts(spec), make_prompts(spec)
    assert a == b and len(a) == 3 and all(len(p) == 5 and all(10 <= t < 20 for t in p) for p in a)


def test_bad_spec_rejected():
    with pytest.raises(ValueError, match="concurrency"):
        LoadSpec(concurrency=0)


def _scripted_app(tokens: int, delay_s: float, max_len: int | None = None, listed: bool = True) -> FastAPI:
    app = FastAPI()
    app.state.completions = 0
    app.state.prompts = []

    if listed:

        @app.get("/v1/models")
        def models():
            card = {"id": "demo", "object": "model", **({"max_model_len": max_len} if max_len else {})}
            return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/completions")
    def completions(body: dict):
        app.state.completions += 1
        app.state.prompts.append(body["prompt"])
        app.state.max_tokens = [*getattr(app.state, "max_tokens", []), body["max_tokens"]]
        n = body["max_tokens"]

        def gen():
            for i in range(n):
                time.sleep(delay_s)
                who = "small" if i % 4 else "large"
                chunk = {
                    "choices": [
                        {
                            "index": 0,
                            "text": "x",
                            "routing": {"tokens_per_model": {who: 1}, "hops": 1 if who == "large" else 0},
                        }
                    ]
                }
                yield f"data: {json.dumps(chunk)}\n\n"
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n, "total_tokens": n}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return app


class _Served:
    """A scripted app served by uvicorn on a free port, in a thread, for the length of a `with` block."""

    def __init__(self, app: FastAPI) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "_Served":
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(5)


def test_run_load_against_scripted_server():
    with _Served(_scripted_app(8, 0.002, max_len=12)) as served:  # 4 + 8 tokens: exactly the context
        spec = LoadSpec(
            url=served.url, concurrency=3, num_prompts=7, output_len=8, prompt_len=4, progress=False
        )
        report = asyncio.run(run_load(spec))
    assert report["completed"] == 7 and report["failed"] == 0
    assert report["output_tokens"] == 56
    assert report["tokens_per_model"] == {"small": 42, "large": 14}
    assert report["hops"] == 14
    assert report["decode_throughput_tok_s"] == pytest.approx(56 / report["wall_s"])
    assert 0 < report["ttft_ms"]["p50"] <= 1e3 * report["e2e_s"]["p50"]
    assert "decode throughput" in format_report(report)
    # each request's own record, in prompt order; 3 workers: the first three are sent at once, the last after
    per = report["per_request"]
    assert len(per) == 7 and all(r["ok"] and r["output_tokens"] == 8 for r in per)
    assert sum(r["hops"] for r in per) == 14 and all(
        r["tokens_per_model"] == {"small": 6, "large": 2} for r in per
    )
    assert max(r["start_s"] for r in per[:3]) < min(r["start_s"] for r in per[3:])
    assert max(r["start_s"] + r["e2e_s"] for r in per) <= report["wall_s"]
    assert report["drain_s"] == pytest.approx(report["wall_s"] - max(r["start_s"] for r in per))
    assert 0 < report["drain_s"] < report["wall_s"] and "drain after the last send" in format_report(report)


def test_a_load_that_does_not_fit_the_models_context_is_refused_before_anything_is_sent():
    """A served benchmark on the H200 once sent 4,096-token prompts to a 4,096-token model and got an HTTP 400
    for every request. The server lists its context (`max_model_len` at /v1/models): a synthetic load that cannot
    fit it is refused first, and `tokenrouter bench` exits 2 with the numbers. A prompts file's token counts are
    the server's to know; a server that does not list models is still benchmarked when the model is named."""
    from typer.testing import CliRunner

    from tokenrouter.cli import app
    from tokenrouter.loadgen.bench import ContextTooLong

    served = _Served(_scripted_app(4, 0.0, max_len=12))
    with served:
        spec = LoadSpec(
            url=served.url, concurrency=2, num_prompts=2, output_len=8, prompt_len=5, progress=False
        )
        with pytest.raises(ContextTooLong, match=r"--prompt-len 5 and --output-len 8 need 13 tokens of context, but "
                           r"'demo' takes 12 \(max_model_len at /v1/models\); nothing was sent"):  # fmt: skip
            asyncio.run(run_load(spec))
        assert served.server.config.app.state.completions == 0
        cli = CliRunner().invoke(app, ["bench", "--url", served.url, "-c", "1", "-n", "1", "--output-len", "8",
                                       "--prompt-len", "5", "--no-progress"])  # fmt: skip
        assert (
            cli.exit_code == 2 and "need 13 tokens of context" in cli.output and "Traceback" not in cli.output
        )
        assert served.server.config.app.state.completions == 0
        fits = LoadSpec(
            url=served.url, concurrency=2, num_prompts=2, output_len=8, prompt_len=4, progress=False
        )
        assert asyncio.run(run_load(fits))["completed"] == 2
    unlisted = _Served(_scripted_app(4, 0.0, listed=False))
    with unlisted:
        spec = LoadSpec(
            url=unlisted.url, model="demo", num_prompts=1, output_len=8, prompt_len=5, progress=False
        )
        assert asyncio.run(run_load(spec))["completed"] == 1


def test_share_per_request_shows_routing_that_fires_on_few_requests():
    """A served r2r run's shape (H200, N = 16): most requests never reach the large model, one is written
    almost wholly by it."""
    from tokenrouter.loadgen.bench import RequestResult, summarize

    results = [RequestResult(ok=True, output_tokens=10, tokens_per_model={"small": 10}) for _ in range(8)]
    results.append(RequestResult(ok=True, output_tokens=10, tokens_per_model={"small": 1, "large": 9}))
    results.append(RequestResult(ok=True, output_tokens=10, tokens_per_model={"small": 8, "large": 2}))
    results.append(RequestResult(ok=False, error="boom"))  # failed requests do not count
    spec = LoadSpec(url="http://x", concurrency=2, num_prompts=11, output_len=10, progress=False)
    report = summarize(spec, "m", results, wall_s=1.0)
    large = report["share_per_request"]["large"]
    assert large["requests_with_any"] == 2 and large["requests"] == 10
    assert large["p50"] == 0.0 and large["max"] == pytest.approx(0.9)
    assert large["p99"] == pytest.approx(_percentile([0.0] * 8 + [0.9, 0.2], 0.99))
    small = report["share_per_request"]["small"]
    assert small["requests_with_any"] == 10 and small["p50"] == 1.0 and small["max"] == 1.0
    text = format_report(report)
    assert "large's share of a request p50 / p99 / max | 0.0 / " in text and "(any in 2 of 10)" in text
    # one model (llm-only): nothing to spread
    solo = [RequestResult(ok=True, output_tokens=4, tokens_per_model={"llm": 4})]
    assert summarize(spec, "m", solo, wall_s=1.0)["share_per_request"] == {}
    assert "share of a request" not in format_report(summarize(spec, "m", solo, wall_s=1.0))


def test_open_loop_arrivals_are_seeded_gamma_gaps_of_the_asked_rate():
    """An open loop's arrivals: the first at 0, gaps of mean 1 / rate, Poisson at burstiness 1 (coefficient of
    variation 1), burstier below it (CV^2 = 1 / shape); the same seed gives the same times. A closed loop has
    none to wait for."""
    import math

    from tokenrouter.loadgen.bench import arrival_times

    n = 20000
    for burst in (1.0, 0.25, 4.0):
        spec = LoadSpec(request_rate=50.0, burstiness=burst, concurrency=None, seed=3)
        times = arrival_times(spec, n)
        assert times[0] == 0.0 and times == arrival_times(spec, n)
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        mean = sum(gaps) / len(gaps)
        cv2 = sum((g - mean) ** 2 for g in gaps) / len(gaps) / mean**2
        assert mean == pytest.approx(1 / 50.0, rel=0.05)
        assert cv2 == pytest.approx(1 / burst, rel=0.1)
    assert arrival_times(LoadSpec(concurrency=2), 3) == [0.0, 0.0, 0.0]
    assert arrival_times(LoadSpec(request_rate=2.0, seed=1), 3) != arrival_times(
        LoadSpec(request_rate=2.0, seed=2), 3
    )
    assert not math.isinf(LoadSpec(request_rate=2.0).request_rate)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"concurrency": None}, "a closed loop needs a concurrency"),
        ({"request_rate": 0.0}, "request rate must be > 0"),
        ({"request_rate": float("nan")}, "request rate must be > 0"),
        ({"request_rate": 1.0, "burstiness": 0.0}, "burstiness must be a finite number > 0"),
        ({"request_rate": 1.0, "burstiness": float("inf")}, "burstiness must be a finite number > 0"),
        ({"burstiness": 0.5}, "give a request rate with it"),
        ({"warmup": -1}, "warmup must be >= 0"),
    ],
)
def test_bad_load_shapes_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        LoadSpec(**kw)


def test_an_open_loop_sends_on_its_own_clock_and_holds_the_cap():
    """Without a cap every request is sent at its arrival time, whatever is in flight (the server takes about
    160 ms a request, the arrivals come every 5 ms or so: many overlap); with a cap of 2 no more than 2 are in
    flight, and the ones that arrived at the cap wait, reported as `queued_ms` and not in their latency. (The
    server's 20 ms a token leave room for a busy machine's hiccups: a full parallel run once failed at 5 ms.)"""
    from tokenrouter.loadgen.bench import arrival_times

    with _Served(_scripted_app(8, 0.02)) as served:
        spec = LoadSpec(url=served.url, request_rate=200.0, concurrency=None, num_prompts=12, output_len=8,
                        prompt_len=4, progress=False, seed=5)  # fmt: skip
        free = asyncio.run(run_load(spec))
        capped_spec = LoadSpec(url=served.url, request_rate=200.0, concurrency=2, num_prompts=12, output_len=8,
                               prompt_len=4, progress=False, seed=5)  # fmt: skip
        capped = asyncio.run(run_load(capped_spec))
    arrivals = arrival_times(spec, 12)
    assert free["completed"] == capped["completed"] == 12
    for rec, at in zip(free["per_request"], arrivals, strict=True):
        assert at <= rec["start_s"] < at + 0.1 and rec["queued_s"] == 0.0
    assert free["max_in_flight"] > 2 and capped["max_in_flight"] == 2
    per = capped["per_request"]
    assert all(
        r["queued_s"] == pytest.approx(r["start_s"] - at, abs=0.01)
        for r, at in zip(per, arrivals, strict=True)
    )
    assert capped["queued_ms"]["p99"] > 10.0 and free["queued_ms"]["p99"] == 0.0
    # the latency is the request's own (about 8 tokens of 20 ms), not the wait at the cap: 12 requests two at a
    # time take about six latencies
    assert max(r["e2e_s"] for r in per) < capped["wall_s"] / 2
    # ... and what the client waited in all is both: the wait at the cap and the latency
    waited = sorted(r["queued_s"] + r["e2e_s"] for r in per)
    assert capped["from_arrival_s"]["p50"] == pytest.approx((waited[5] + waited[6]) / 2)
    assert capped["from_arrival_s"]["p99"] > capped["e2e_s"]["p99"]
    assert capped["request_throughput_req_s"] == pytest.approx(12 / capped["wall_s"])
    assert capped["spec"]["request_rate"] == 200.0 and free["load"].startswith("open loop, 200 requests/s")
    text = format_report(capped)
    assert "open loop, 200 requests/s (Poisson), at most 2 in flight" in text and "queued at the cap" in text
    assert "from arrival to end p50 / p99 (s)" in text
    assert re.search(r"\| most requests in flight +\| 2 +\|", text)


def test_a_warmup_goes_first_with_other_prompts_and_is_not_counted():
    """`warmup` requests are sent before the measured ones, with prompts a prefix cache cannot have seen from
    the measured load (another seed), and the report counts the measured ones only."""
    with _Served(_scripted_app(4, 0.0)) as served:
        spec = LoadSpec(url=served.url, concurrency=2, warmup=3, num_prompts=4, output_len=4, prompt_len=6,
                        progress=False)  # fmt: skip
        report = asyncio.run(run_load(spec))
        sent = served.server.config.app.state.prompts
    assert len(sent) == 7 and report["completed"] == 4 and report["output_tokens"] == 16
    measured = make_prompts(spec)
    assert sent[3:] == measured or sorted(map(tuple, sent[3:])) == sorted(map(tuple, measured))
    assert not set(map(tuple, sent[:3])) & set(map(tuple, measured))
    assert report["warmup"] == {"requests": 3, "failed": 0, "errors": []}
    text = format_report(report)
    assert re.search(r"\| warm-up requests \(not counted\) +\| 3 \(0 failed\) +\|", text)
    assert report["spec"]["request_rate"] is None and report["load"] == "closed loop, 2 in flight"
    json.dumps(report, allow_nan=True)  # the spec has no infinity in it
    assert "Infinity" not in json.dumps(report["spec"])


def test_bench_cli_open_loop_and_its_usage_errors(tmp_path):
    """`tokenrouter bench --request-rate R` runs an open loop with no cap unless -c is given; a bad rate or
    burstiness, or a burstiness without a rate, exits 2 with the reason, before anything is sent; a closed loop
    keeps its default of 4 workers. A report of an open loop is refused by the simulator's replay, which models
    a closed loop."""
    from typer.testing import CliRunner

    from tokenrouter.cli import app
    from tokenrouter.throughput.workload import WorkloadError, read_requests

    runner = CliRunner()
    with _Served(_scripted_app(4, 0.0)) as served:
        base = ["bench", "--url", served.url, "-n", "3", "--output-len", "4", "--no-progress"]
        for extra, message in [
            (["--request-rate", "0"], "request rate must be > 0"),
            (["--request-rate", "5", "--burstiness", "-1"], "burstiness must be a finite number > 0"),
            (["--burstiness", "0.5"], "give a request rate with it"),
            (["--warmup", "-2"], "warmup must be >= 0"),
            (["--slo-ttft-ms", "0"], "slo_ttft_ms must be a finite number of ms > 0"),
        ]:
            got = runner.invoke(app, base + extra)
            assert got.exit_code == 2 and message in got.output and "Traceback" not in got.output, got.output
        assert served.server.config.app.state.completions == 0
        out = tmp_path / "open.json"
        got = runner.invoke(app, base + ["--request-rate", "50", "--json", str(out)])
        assert got.exit_code == 0 and "no cap on requests in flight" in got.output, got.output
        closed = runner.invoke(app, base)
        assert closed.exit_code == 0 and "closed loop, 4 in flight" in closed.output
    report = json.loads(out.read_text())
    assert report["spec"]["concurrency"] is None and report["completed"] == 3
    with pytest.raises(WorkloadError, match="an open-loop load \\(50 requests/s\\)"):
        read_requests(out)


def test_a_jsonl_prompts_file_gives_each_request_its_prompt_and_length(tmp_path):
    """A `.jsonl` prompts file: text or token-id prompts, each with its own output_len or the default; the server
    is asked for each request's own max_tokens. Token-id prompts are checked against the context (text ones are
    the server's to count). A bad line is named by file and line, and the CLI exits 2 before sending."""
    from typer.testing import CliRunner

    from tokenrouter.cli import app
    from tokenrouter.loadgen.bench import ContextTooLong, Request, make_requests

    good = tmp_path / "load.jsonl"
    good.write_text(
        '{"prompt": "def f():", "output_len": 3}\n\n{"prompt": [11, 12, 13]}\n{"prompt": "x", "output_len": 5}\n'
    )
    spec = LoadSpec(prompts_file=str(good), num_prompts=4, output_len=4, concurrency=1, progress=False)
    assert make_requests(spec) == [
        Request("def f():", 3),
        Request([11, 12, 13], 4),
        Request("x", 5),
        Request("def f():", 3),
    ]
    with _Served(_scripted_app(4, 0.0, max_len=7)) as served:
        spec = LoadSpec(url=served.url, prompts_file=str(good), num_prompts=4, output_len=4, concurrency=1,
                        progress=False)  # fmt: skip
        report = asyncio.run(run_load(spec))
        assert served.server.config.app.state.max_tokens == [3, 4, 5, 3]
        assert report["output_tokens"] == 15 and [r["output_tokens"] for r in report["per_request"]] == [
            3,
            4,
            5,
            3,
        ]
        long = tmp_path / "long.jsonl"
        long.write_text('{"prompt": [1, 2, 3, 4, 5], "output_len": 3}\n')
        with pytest.raises(ContextTooLong, match="a prompt of 5 token ids and output_len 3 need 8 tokens"):
            asyncio.run(
                run_load(LoadSpec(url=served.url, prompts_file=str(long), num_prompts=1, progress=False))
            )
        assert served.server.config.app.state.completions == 4
        runner = CliRunner()
        for body, message in [
            (
                '{"prompt": "a"}\n{"prompt": "b", "output_len": 0}\n',
                ':2: "output_len" must be an int >= 1, got 0',
            ),
            ('{"prompt": ""}\n', ':1: "prompt" must be a non-empty string or list of token ids'),
            ('{"prompt": [1, -2]}\n', ':1: "prompt" must be a non-empty string or list of token ids'),
            ('["a"]\n', ':1: each line must be a JSON object with a "prompt"'),
            ('{"prompt": "a"\n', ":1: not a JSON object"),
        ]:
            bad = tmp_path / "bad.jsonl"
            bad.write_text(body)
            got = runner.invoke(
                app, ["bench", "--url", served.url, "--prompts-file", str(bad), "--no-progress"]
            )
            assert got.exit_code == 2 and f"{bad}{message}" in got.output and "Traceback" not in got.output, (
                got.output
            )
        binary = tmp_path / "prompts.txt"
        binary.write_bytes(b"\xff\xfe\x00abc")
        got = runner.invoke(
            app, ["bench", "--url", served.url, "--prompts-file", str(binary), "--no-progress"]
        )
        assert got.exit_code == 2 and "not a UTF-8 text file" in got.output, got.output
        assert served.server.config.app.state.completions == 4


def test_goodput_counts_the_requests_within_both_objectives():
    """With SLOs a request counts when its TTFT and its TPOT are both within them; a failed one is sent and not
    met; a one-token request has no TPOT to miss. Without SLOs the report has no goodput."""
    from tokenrouter.loadgen.bench import RequestResult, summarize

    def req(ttft_s, tpot_s, tokens=10):
        return RequestResult(
            ok=True, ttft_s=ttft_s, e2e_s=ttft_s + tpot_s * (tokens - 1), output_tokens=tokens
        )

    results = [req(0.05, 0.005), req(0.2, 0.005), req(0.05, 0.02), req(0.09, 0.0099), req(0.05, 0.5, tokens=1),
               RequestResult(ok=False, error="boom")]  # fmt: skip
    spec = LoadSpec(url="http://x", num_prompts=6, slo_ttft_ms=100, slo_tpot_ms=10, progress=False)
    report = summarize(spec, "m", results, wall_s=2.0)
    assert report["slo_met"] == 3 and report["slo_met_share"] == pytest.approx(0.5)
    assert report["goodput_req_s"] == pytest.approx(1.5) and report["slo"] == {"ttft_ms": 100, "tpot_ms": 10}
    assert (
        "within the SLO (TTFT <= 100 ms, TPOT <= 10 ms) | 3 of 6 (50.0%), goodput 1.50 req/s"
        in format_report(report)
    )
    only_ttft = summarize(LoadSpec(url="http://x", slo_ttft_ms=100, progress=False), "m", results, wall_s=2.0)
    assert only_ttft["slo_met"] == 4 and "(TTFT <= 100 ms)" in format_report(only_ttft)
    plain = summarize(LoadSpec(url="http://x", progress=False), "m", results, wall_s=2.0)
    assert "slo" not in plain and "goodput" not in format_report(plain)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="slo_tpot_ms must be a finite number of ms > 0"):
            LoadSpec(slo_tpot_ms=bad)


def test_bench_refuses_what_it_cannot_do_before_sending_and_writes_valid_json(tmp_path):
    """An audit's findings: a --json path that cannot be written failed after the whole run; a model the server
    does not serve sent every request to a 404; --temperature nan or -1 went to the server; an OpenAI-style base
    URL (…/v1) asked for /v1/v1/models; a folder as --prompts-file was "not found"; a report of failed requests
    held NaN, which is not JSON. Each is now refused before anything is sent (exit 2), or fixed."""
    from typer.testing import CliRunner

    from tokenrouter.cli import app

    runner = CliRunner()
    with _Served(_scripted_app(4, 0.0)) as served:
        base = ["bench", "--url", served.url, "-n", "2", "--output-len", "4", "--no-progress"]
        for extra, message in [
            (["--json", str(tmp_path / "nowhere" / "r.json")], "cannot write --json"),
            (["--json", str(tmp_path)], "is a folder"),
            (["--model", "nope"], "model 'nope' is not served here (/v1/models lists 'demo')"),
            (["--temperature", "nan"], "temperature must be a finite number >= 0"),
            (["--temperature", "-1"], "temperature must be a finite number >= 0"),
            (["--prompts-file", str(tmp_path)], "prompts file is a folder"),
        ]:
            got = runner.invoke(app, base + extra)
            assert got.exit_code == 2 and message in got.output and "Traceback" not in got.output, got.output
        assert served.server.config.app.state.completions == 0
        got = runner.invoke(app, ["bench", "--url", served.url + "/v1/", "-n", "2", "--output-len", "4",
                                  "--no-progress", "--json", str(tmp_path / "ok.json")])  # fmt: skip
        assert got.exit_code == 0 and served.server.config.app.state.completions == 2, got.output
    assert json.loads((tmp_path / "ok.json").read_text())["url"] == served.url
    # a run whose every request failed: percentiles of nothing are null in the file, not NaN
    from tokenrouter.loadgen.bench import RequestResult, summarize, write_report

    report = summarize(
        LoadSpec(url="http://x", progress=False), "m", [RequestResult(ok=False, error="x")], 1.0
    )
    write_report(report, tmp_path / "failed.json")
    text = (tmp_path / "failed.json").read_text()
    assert "NaN" not in text and json.loads(text)["ttft_ms"]["p50"] is None


def test_shared_prefix_prompts_share_their_groups_prefix():
    spec = LoadSpec(num_prompts=6, shared_prefix_len=8, prefix_groups=2, prompt_len=3, seed=1)
    prompts = make_prompts(spec)
    assert all(len(p) == 11 for p in prompts)
    assert all(prompts[i][:8] == prompts[i % 2][:8] for i in range(6)) and prompts[0][:8] != prompts[1][:8]
    assert len({tuple(p[8:]) for p in prompts}) == 6
    assert "a 8-token prefix shared in 2 group(s)" in spec.describe()


def test_conversations_from_flags_and_from_a_file(tmp_path):
    from tokenrouter.loadgen.bench import make_conversations
    from tokenrouter.loadgen.workloads import next_prompt

    spec = LoadSpec(num_prompts=3, turns=4, system_len=10, prompt_len=2, output_len=5)
    convs = make_conversations(spec)
    assert len(convs) == 3 and all(c.system == convs[0].system and len(c.users) == 4 for c in convs)
    assert make_prompts(spec)[0] == convs[0].system + convs[0].users[0]  # the first turns
    assert next_prompt([1, 2], [3], "x", [4]) == [1, 2, 3, 4]  # the answer's ids, exactly
    assert next_prompt("sys: hi", None, " hello", " more") == "sys: hi hello more"
    path = tmp_path / "chats.jsonl"
    path.write_text(
        '{"system": "be brief", "turns": ["hi", "and?"], "output_len": 3}\n\n{"turns": [[5, 6]]}\n'
    )
    spec = LoadSpec(num_prompts=3, prompts_file=str(path))
    assert spec.conversations and [len(c.users) for c in make_conversations(spec)] == [2, 1, 2]
    for line, message in (
        ('{"turns": []}', 'non-empty list "turns"'),
        ('{"turns": ["a", [1]], "system": "s"}', "mixes text and token ids"),
        ('{"turns": ["a"], "output_len": 0}', '"output_len" must be an int >= 1'),
        ('{"turns": [""]}', "each turn must be a non-empty string"),
    ):
        path.write_text(line + "\n")
        with pytest.raises(ValueError, match=re.escape(message)):
            make_conversations(LoadSpec(prompts_file=str(path)))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"turns": 2, "shared_prefix_len": 4}, "not both"),
        ({"system_len": 4}, "give --turns with them"),
        ({"turns": 2, "request_rate": 2.0}, "conversations run as a closed loop"),
        ({"prefix_groups": 0}, "prefix_groups must be >= 1"),
        ({"turns": 2, "think_time_s": -1.0}, "think time"),
    ],
)
def test_bad_prefix_workloads_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        LoadSpec(**kw)


def test_the_report_table_is_aligned():
    """Every row of `bench`'s table, the longest ones (the SLO, each model's share of a request, warm-up) with
    the shortest, has its column bars in the same places."""
    from tokenrouter.loadgen.bench import RequestResult, summarize

    results = [
        RequestResult(ok=True, output_tokens=10, tokens_per_model={"slm": 8, "llm": 2}) for _ in range(7)
    ]
    results.append(RequestResult(ok=False, error="boom"))
    spec = LoadSpec(url="http://x", concurrency=2, num_prompts=8, output_len=10, progress=False,
                    slo_ttft_ms=100, slo_tpot_ms=50, request_rate=4.0)  # fmt: skip
    report = summarize(spec, "m", results, wall_s=1.0)
    report.update(max_in_flight=2, warmup={"requests": 3, "failed": 1, "errors": ["slow"]})
    table = [line for line in format_report(report).splitlines() if line.startswith("|")]
    bars = {tuple(i for i, ch in enumerate(line) if ch == "|") for line in table}
    assert len(table) > 20 and len(bars) == 1, "\n".join(table)
    assert "errors: boom" in format_report(report) and "warm-up errors: slow" in format_report(report)


def test_answer_ids_come_from_each_chunks_token_ids_or_from_the_routing_extension():
    """SGLang and vLLM stream `token_ids` per chunk (the chunk's own); TokenRouter returns the whole answer's in
    `routing.token_ids`. A conversation's next turn re-sends either, exactly."""
    from tokenrouter.loadgen.bench import _read_chunk
    from tokenrouter.loadgen.spec import RequestResult

    r = RequestResult(ok=False)
    for ids, text in (([5, 6], "ab"), ([7], "c"), ([], "")):
        _read_chunk({"choices": [{"index": 0, "text": text, "token_ids": ids}]}, r, None)
    assert r.token_ids == [5, 6, 7] and r.text == "abc"
    t = RequestResult(ok=False)
    _read_chunk({"choices": [{"index": 0, "text": "ab"}]}, t, None)
    _read_chunk({"choices": [{"index": 0, "text": "", "routing": {"token_ids": [1, 2]}}]}, t, None)
    assert t.token_ids == [1, 2]
