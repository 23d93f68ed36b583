"""bench/matrix.py without serving anything: usage errors, run specs, the parts' shape, and the tables it
builds from raw records (the --cpu-smoke run exercises the serving side).
The archives under tests/fixtures/runs are served matrix runs (H200), cut to the files these tests read."""

from __future__ import annotations

import importlib.util
import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RUNS = ROOT / "tests" / "fixtures" / "runs"  # the served runs' archives, cut to the files these tests read
spec = importlib.util.spec_from_file_location("matrix", ROOT / "bench" / "matrix.py")
matrix = importlib.util.module_from_spec(spec)
sys.modules["matrix"] = matrix  # dataclasses look their module up there
spec.loader.exec_module(matrix)


def record(mode: str, n: int, tok: float, predicted: float | None = None) -> dict:
    report = {"decode_throughput_tok_s": tok, "ttft_ms": {"p50": 1.0}, "tpot_ms": {"p50": 2.0},
              "e2e_s": {"p99": 3.0}, "tokens_per_model": {"slm": 9, "llm": 1}, "hops": 2}  # fmt: skip
    return {"pair": "0.6b+8b", "policy": "bern0.1", "mode": mode, "n": n, "output_len": 512, "report": report,
            "thresholds": None, "predicted_tok_s": predicted, "startup_s": 20.0}  # fmt: skip


def test_usage_errors_exit_2(capsys):
    assert matrix.main([]) == 2
    assert matrix.main(["--part", "8b-nope"]) == 2
    assert "unknown part '8b-nope'" in capsys.readouterr().err
    assert matrix.main(["--pair", "0.6b+8b", "--policy", "r2r", "--run", "fast:4"]) == 2
    assert matrix.main(["--run", "tokenrouter:4"]) == 2  # needs --pair and --policy
    for bad in ("-1", "nan", "inf"):
        run = ["--pair", "tiny", "--policy", "bern0.1", "--run", "tokenrouter:4", "--max-delay-ms", bad]
        assert matrix.main(run) == 2
        assert "--max-delay-ms must be a finite number >= 0" in capsys.readouterr().err
    for flag in ("--rounds", "--profile-rounds", "--prompt-len"):
        assert (
            matrix.main(["--pair", "tiny", "--policy", "bern0.1", "--run", "tokenrouter:4", flag, "0"]) == 2
        )
        assert f"{flag} must be an int >= 1, got 0" in capsys.readouterr().err


def test_a_prompt_and_output_over_the_plans_context_is_refused_before_anything_starts(capsys, monkeypatch):
    """A matrix once started a server and failed at its profile: 4,096-token prompts against the plans'
    4,096-token context, every request refused with HTTP 400. The arguments are checked first now, per part,
    with the part's own output length (the tiny CPU pair's 32 where --output-len is left at 512)."""
    monkeypatch.setattr(matrix, "run_part", lambda *a: pytest.fail("a part ran"))
    run = ["--pair", "0.6b+8b", "--policy", "bern0.35", "--run", "tokenrouter:4"]
    assert matrix.main([*run, "--prompt-len", "4096"]) == 2
    err = capsys.readouterr().err
    assert "--prompt-len 4096 and 512 output tokens need 4608 tokens of context, over the 4096" in err
    assert "(--prompt-len 3584 at most)" in err
    assert matrix.main([*run, "--prompt-len", "3000", "--output-len", "1200"]) == 2
    assert "need 4200 tokens" in capsys.readouterr().err
    tiny = ["--pair", "tiny", "--policy", "bern0.1", "--run", "tokenrouter:4", "--prompt-len", "4064"]
    assert matrix.part_output_len(matrix.Part("tiny", "bern0.1", {}), 512) == 32
    with pytest.raises(pytest.fail.Exception, match="a part ran"):
        matrix.main(tiny)  # 4064 + 32 fits: it gets as far as running the part
    assert matrix.main([*tiny[:-1], "4065"]) == 2


def test_the_load_generator_gets_the_prompt_length(tmp_path, monkeypatch):
    cmds = []
    monkeypatch.setattr(matrix, "run_cmd", lambda s, cmd, log, timeout=None: cmds.append(cmd))
    s = matrix.Settings(out=tmp_path, work=tmp_path / "w", device="cpu", prompt_len=300)
    matrix.bench(s, "http://x", 4, 8, 512, None, tmp_path / "log")
    (cmd,) = cmds
    assert cmd[cmd.index("--prompt-len") + 1] == "300"


def test_an_open_loop_reaches_the_measured_rows_only(tmp_path, monkeypatch, capsys):
    """`--request-rate` (and the SLOs) go to the measured `bench` call, not to its closed-loop warm-up; bad
    values are usage errors."""
    cmds = []
    monkeypatch.setattr(matrix, "run_cmd", lambda s, cmd, log, timeout=None: cmds.append(cmd))
    monkeypatch.setattr(matrix.json, "loads", lambda text: {})
    (tmp_path / "r.json").write_text("{}")
    s = matrix.Settings(out=tmp_path, work=tmp_path / "w", device="cpu", request_rate=1.5, slo_tpot_ms=40.0)
    matrix.bench(s, "http://x", 4, 4, 16, None, tmp_path / "log")
    matrix.bench(s, "http://x", 4, 8, 512, tmp_path / "r.json", tmp_path / "log")
    warm, measured = cmds
    assert "--request-rate" not in warm and "--slo-tpot-ms" not in warm
    assert measured[measured.index("--request-rate") + 1] == "1.5"
    assert measured[measured.index("--slo-tpot-ms") + 1] == "40"
    assert "--slo-ttft-ms" not in measured
    run = ["--pair", "tiny", "--policy", "bern0.1", "--run", "tokenrouter:4"]
    for flag, bad in (("--request-rate", "0"), ("--request-rate", "inf"), ("--slo-ttft-ms", "-5"),
                      ("--profile-s", "0")):  # fmt: skip
        assert matrix.main([*run, flag, bad]) == 2
        assert f"error: {flag} {bad!r}: expected a number of" in capsys.readouterr().err


def test_an_open_loops_tables_give_latencies_and_leave_out_the_closed_loop_checks():
    """Rows at a request rate are their own group: requests per second served, the latencies' p50 / p99, the
    wait at the cap and the goodput; no DTMC prediction, which models a closed loop."""

    def spread(p50, p99):
        return {"mean": p50, "p50": p50, "p99": p99}

    recs = [record("tokenrouter", 8, 300.0, predicted=400.0), record("llm-only", 8, 150.0)]
    for r, (ttft, queued) in zip(recs, ((40.0, 0.0), (90.0, 250.0)), strict=True):
        r["request_rate"] = 2.0
        r["report"] |= {"request_throughput_req_s": 1.96, "ttft_ms": spread(ttft, 2 * ttft),
                        "tpot_ms": spread(8.0, 9.5), "e2e_s": spread(4.1, 5.0), "queued_ms": spread(queued, 900.0),
                        "max_in_flight": 8, "goodput_req_s": 1.5, "slo_met_share": 0.75,
                        "per_request": [{"ok": True, "queued_s": q, "e2e_s": 4.0} for q in (0.0, 0.5, 1.0)]}  # fmt: skip
    closed = [record("tokenrouter", 8, 320.0, predicted=400.0), record("llm-only", 8, 200.0)]
    text = matrix.tables(recs + closed)
    opened, closed_text = sorted(text.split("### ")[1:], key=lambda part: "open loop" not in part)
    assert "an open loop of 2 requests/s, at most N in flight" in opened
    assert "| TR / llm-only | 2.00x |" in opened
    assert (
        "| tokenrouter | 8 | 1.96 | 40.0 / 80.0 | 8.00 / 9.50 | 4.10 / 5.00 | 0 / 900 | 4.50 / 4.99 | 8 | 1.50 (75 %) | - |"
        in opened
    )
    assert "| llm-only | 8 | 1.96 | 90.0 / 180.0 |" in opened
    assert "measured / predicted" not in opened
    assert "| measured / predicted | 0.80x |" in closed_text  # the closed loop's own group


def test_an_open_loop_row_is_simulated_on_its_own_step_times():
    """`open_loop_simulation`: an llm-only row (one model, its step latency by batch size from its scrapes) at its
    rate and cap; far below what it serves each request takes its tokens' steps alone, far above it the backlog
    at the cap grows. The open loop's table shows the simulation beside the measured."""
    after = {f'tokenrouter_steps_by_batch_total{{model="llm",bs="{b}"}}': 100.0 for b in (1, 2, 4)}
    after |= {
        f'tokenrouter_step_seconds_by_batch_total{{model="llm",bs="{b}"}}': 100 * 0.005 for b in (1, 2, 4)
    }
    rec = record("llm-only", 4, 100.0) | {"request_rate": 0.5, "output_len": 64, "max_delay_ms": 20.0,
                                          "metrics_before": {}, "metrics_after": after}  # fmt: skip
    rec["report"] |= {"tokens_per_model": {"llm": 640}, "tpot_ms": {"p50": 5.1, "p99": 6.0}, "e2e_s": {"p50": 0.33, "p99": 0.4},
                      "request_throughput_req_s": 0.5, "ttft_ms": {"p50": 5.0, "p99": 6.0},
                      "queued_ms": {"p50": 0.0, "p99": 0.0}, "per_request": []}  # fmt: skip
    sim = matrix.open_loop_simulation(rec, horizon_ms=60_000.0)
    assert sim["tpot_ms"]["p50"] == pytest.approx(5.0) and sim["e2e_ms"]["p50"] == pytest.approx(
        320.0, rel=0.01
    )
    assert sim["backlog"] == 0
    assert matrix.open_loop_simulation(rec, rate=100.0, seeds=1, horizon_ms=5_000.0)["backlog"] > 100
    table = "\n".join(matrix.latency_table([rec]))
    assert "| llm-only | 4 | 5.00 / 5.10 | 0.32 / 0.33 | 0 / 0 | 0.32 / 0.32 | 0 |" in table
    # on the row's own arrivals (three, far apart: every request alone), with its measured gap between steps
    rec["report"]["spec"] = {"request_rate": 0.5, "output_len": 64, "concurrency": 4}
    rec["report"]["per_request"] = [
        {"ok": True, "start_s": 2.0 * k, "queued_s": 0.0, "e2e_s": 0.3} for k in range(3)
    ]
    rec["metrics_after"] = after | {'tokenrouter_step_gaps_total{model="llm"}': 100.0,
                                    'tokenrouter_step_gap_seconds_total{model="llm"}': 0.1}  # fmt: skip
    assert matrix.run_gap_ms(rec, ("llm",)) == pytest.approx((1.0,))
    own = matrix.open_loop_simulation(rec, seeds=1, own_arrivals=True)
    assert own["e2e_ms"]["p50"] == pytest.approx(320.0) and own["backlog"] == 0
    assert matrix.open_loop_simulation(rec, seeds=1, own_arrivals=True, gaps=True)["e2e_ms"][
        "p50"
    ] == pytest.approx(64 * 6.0)


def test_a_profiled_load_summarizes_each_trace_once(tmp_path, monkeypatch):
    """`--profile-s`: a second load under a live profile; each trace is summarized once (the lockstep process
    answers for every model with one trace), and a failed profile is reported, not raised."""
    import httpx

    trace = tmp_path / "t.trace.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "tokenrouter.forward", "ts": 0.0, "dur": 500.0}]}))  # fmt: skip
    loads, posts = [], []
    monkeypatch.setattr(matrix, "bench", lambda s, url, n, num, length, out, log: loads.append((n, num, out)))

    class Answer:
        def __init__(self, body: dict | None) -> None:
            self.body = body

        def raise_for_status(self) -> None:
            if self.body is None:
                raise httpx.HTTPStatusError("409", request=None, response=None)

        def json(self) -> dict:
            return self.body

    ops = tmp_path / "t.ops.txt"
    ops.write_text("| Name |")
    answers = {"/start_profile": Answer({}), "/stop_profile": Answer({"files": {"slm": [str(trace), str(ops)],
                                                                              "llm": [str(trace), str(ops)]}})}  # fmt: skip
    monkeypatch.setattr(
        httpx, "post", lambda url, timeout: posts.append(url) or answers[url[len("http://x") :]]
    )
    s = matrix.Settings(out=tmp_path, work=tmp_path / "w", device="cpu", profile_s=0.01, profile_after_s=0.0)
    got = matrix.profiled_load(s, "http://x", 4, tmp_path / "log", tmp_path / "kept")
    assert [f.name for f in (tmp_path / "kept").iterdir()] == ["ops-slm.txt"]  # the tables, not the traces
    assert loads == [(4, 8, None)] and posts == ["http://x/start_profile", "http://x/stop_profile"]
    assert list(got) == ["slm"] and got["slm"]["steps"] == 1 and got["slm"]["forward_ms"] == 0.5
    rec = record("lockstep", 4, 100.0) | {"trace": got}
    assert "| lockstep | 4 | slm | 1 | 0.500 | 0.500 | 0.000 | 0.000 | - / - | - | - |" in matrix.tables(
        [rec]
    )
    answers["/start_profile"] = Answer(None)
    failed = matrix.profiled_load(s, "http://x", 4, tmp_path / "log")
    assert failed.startswith("the profile failed: 409")
    assert f"| lockstep | 4 | - | {failed} |" in matrix.tables([rec | {"trace": failed}])


def test_the_served_profiles_load_is_profile_rounds_x_n(tmp_path, monkeypatch):
    """`--profile-rounds` thickens the served profiles' load alone (`--rounds` the measured rows'): the warm-up
    is N requests, the profile's load PROFILE_ROUNDS x N (ROUNDS x N without it), of `profile_len` tokens."""
    import httpx

    loads = []

    class FakeServer:
        url = "http://fake"

        def __init__(self, *a):
            pass

        def stop(self):
            pass

    def fake_bench(s, url, n, requests, output_len, json_path, log, rate=None):
        loads.append((n, requests, output_len) + ((rate,) if rate else ()))

    monkeypatch.setattr(matrix, "Server", FakeServer)
    monkeypatch.setattr(matrix, "bench", fake_bench)
    monkeypatch.setattr(matrix, "run_cmd", lambda *a, **k: None)
    monkeypatch.setattr(matrix.time, "sleep", lambda _: None)
    monkeypatch.setattr(httpx, "get", lambda *a, **k: type("R", (), {"text": "# metrics"})())
    for profile_rounds, want in ((None, 3), (8, 8)):
        loads.clear()
        s = matrix.Settings(out=tmp_path / "out", work=tmp_path / "w", device=None, rounds=3,
                            profile_rounds=profile_rounds)  # fmt: skip
        matrix.served_profiles(s, tmp_path / "p.plan", [4, 16], tmp_path, "eager", ())
        assert loads == [(4, 4, s.warmup_len), (4, want * 4, s.profile_len),
                         (16, 16, s.warmup_len), (16, want * 16, s.profile_len)]  # fmt: skip
    # tuning at a rate: the profile's load is an open loop at the rate (the warm-up a closed loop)
    for tune_at_rate, rate in ((False, None), (True, 2.5)):
        loads.clear()
        s = matrix.Settings(out=tmp_path / "out", work=tmp_path / "w", device=None, rounds=3, request_rate=2.5,
                            tune_at_rate=tune_at_rate)  # fmt: skip
        matrix.served_profiles(s, tmp_path / "p.plan", [4], tmp_path, "eager", ())
        assert loads == [(4, 4, s.warmup_len), (4, 12, s.profile_len) + ((rate,) if rate else ())]


def test_max_delay_goes_into_the_plans(tmp_path):
    s = matrix.Settings(out=tmp_path, work=tmp_path / "w", device="cpu", max_delay_ms=20.0)
    plan = matrix.compile_policy(s, "tiny", "bern0.1", tmp_path, None)
    assert plan["serve"]["max_delay_ms"] == 20.0
    assert (
        matrix.compile_policy(matrix.Settings(tmp_path, tmp_path, "cpu"), "tiny", "bern0.1", tmp_path, None)[
            "serve"
        ]["max_delay_ms"]
        == 5.0
    )


def test_parts_cover_the_issue_matrix():
    runs = {}
    for part in matrix.PARTS.values():
        for mode, ns in part.runs.items():
            for n in ns:
                runs.setdefault((part.pair, part.policy, mode), set()).add(n)
    for policy in matrix.POLICIES:
        for mode in matrix.MODES:  # 0.6B + 8B, N = 4 and 8: every mode
            assert {4, 8} <= runs[("0.6b+8b", policy, mode)], (policy, mode)
        for mode in ("tokenrouter", "llm-only"):
            assert {1, 16} <= runs[("0.6b+8b", policy, mode)]
        for mode in ("tokenrouter", "llm-only", "lockstep"):  # 0.6B + 32B, N = 4
            assert 4 in runs[("0.6b+32b", policy, mode)]
    assert matrix.parse_runs(["lockstep:4,8"]) == {"lockstep": (4, 8)}
    assert matrix.parse_runs(["lockstep:4", "eager:8", "lockstep:8,4"]) == {"lockstep": (4, 8), "eager": (8,)}


def test_a_row_that_would_end_past_the_deadline_is_not_started():
    assert matrix.out_of_time(None, 1e9, 1e9, 3) is None
    assert matrix.out_of_time(300, 100, 40, 1) is None
    assert matrix.out_of_time(300, 292, 0, 1) is None  # nothing served yet: no estimate
    assert matrix.out_of_time(300, 292, 42, 1) == "8 s left of --deadline-s 300, and a row has taken 42 s"
    assert matrix.out_of_time(300, 200, 40, 3) is not None  # a server of three Ns needs three rows' time
    assert matrix.out_of_time(300, 301, 0, 1) == "the part passed --deadline-s 300"


def test_by_batch_table_gives_ms_and_tokens_per_step_all_and_alone():
    def c(name: str, model: str, bs: int) -> str:
        return f'tokenrouter_{name}_by_batch_total{{model="{model}",bs="{bs}"}}'

    rec = record("tokenrouter", 8, 100.0)
    rec["metrics_before"] = {c("steps", "slm", 2): 10.0, c("step_seconds", "slm", 2): 0.01}
    rec["metrics_after"] = {
        c("steps", "slm", 2): 110.0, c("step_seconds", "slm", 2): 0.21, c("step_tokens", "slm", 2): 260.0,
        c("alone_steps", "slm", 2): 40.0, c("alone_step_seconds", "slm", 2): 0.06,
        c("alone_step_tokens", "slm", 2): 80.0,
        c("steps", "llm", 6): 50.0, c("step_seconds", "llm", 6): 0.35,  # a server before the token counters
    }  # fmt: skip
    lines = matrix.batch_table([rec, record("llm-only", 8, 50.0)])
    rows = [ln for ln in lines if ln.startswith("| tokenrouter")]
    assert rows == [
        "| tokenrouter | 8 | llm | 6 | 50 | 7.00 | - | 0 | - | - |",
        "| tokenrouter | 8 | slm | 2 | 100 | 2.00 | 2.60 | 40 | 1.50 | 2.00 |",
    ]
    assert matrix.batch_table([record("llm-only", 8, 50.0)]) == []


def test_by_batch_report_gives_the_served_profiles_first(capsys):
    """`--report ARCHIVE --by-batch` on run93.tar.gz (H200): the eager profile and the second one,
    served at (2, 5), from their own scrapes, before the measured rows. The second profile ran the 0.6B alone at
    3 rows 61 times at 2.00 ms with 4.20 tokens a step, against 1.32 ms with 4.28 at 4 rows: not more tokens."""
    run93 = RUNS / "run93.tar.gz"
    profiles = matrix.profile_records([str(run93)])
    assert [(r["label"], r["n"]) for r in profiles] == [("profile B-slm2,llm5", 8), ("profile eager", 8)]
    run92 = RUNS / "run92.tar.gz"
    both = matrix.profile_records([str(run92), str(run93)])  # two archives, same file names: each its own
    assert len(both) == 4 and both[2:] == profiles and both[:2] != profiles
    assert matrix.main(["--report", str(run93), "--by-batch"]) == 0
    out = capsys.readouterr().out
    lines = out[out.index("By batch size") :].splitlines()
    assert "| profile B-slm2,llm5 | 8 | slm | 3 | 566 | 2.34 | 3.29 | 61 | 2.00 | 4.20 |" in lines
    assert "| profile B-slm2,llm5 | 8 | slm | 4 | 392 | 1.33 | 4.28 | 391 | 1.32 | 4.28 |" in lines
    first = [
        ln.split(" | ")[0] for ln in lines if ln.startswith("| profile") or ln.startswith("| tokenrouter")
    ]
    assert first.index("| tokenrouter") > max(i for i, x in enumerate(first) if x.startswith("| profile"))


def test_by_shape_report_takes_the_runs_deltas(capsys, tmp_path):
    """`--report --by-shape`: each TokenRouter / eager row's steps by shape, as the difference of the two scrapes,
    with ms and tokens per step; shapes that did not step in the run are left out, other modes too."""
    key = 'tokenrouter_{}_by_shape_total{{model="slm",bs="3",q="{}",overlap="{}"}}'
    before = {key.format("steps", 1, "alone"): 10.0, key.format("step_seconds", 1, "alone"): 0.013,
              key.format("step_tokens", 1, "alone"): 30.0, key.format("steps", 8, "alone"): 4.0}  # fmt: skip
    after = {key.format("steps", 1, "alone"): 110.0, key.format("step_seconds", 1, "alone"): 0.143,
             key.format("step_tokens", 1, "alone"): 330.0, key.format("steps", 8, "alone"): 4.0,
             key.format("steps", 8, "overlapped"): 20.0, key.format("step_seconds", 8, "overlapped"): 0.05,
             key.format("step_tokens", 8, "overlapped"): 160.0}  # fmt: skip
    tr = record("tokenrouter", 8, 500.0) | {"metrics_before": before, "metrics_after": after}
    lines = matrix.shape_table([tr, record("llm-only", 8, 400.0) | {"metrics_after": after}])
    rows = [ln for ln in lines if ln.startswith("| tokenrouter") or ln.startswith("| llm-only")]
    assert rows == [
        "| tokenrouter | 8 | slm | 3 | 1 | alone | 100 | 1.30 | 3.00 |",
        "| tokenrouter | 8 | slm | 3 | 8 | overlapped | 20 | 2.50 | 8.00 |",
    ]
    assert matrix.shape_table([record("tokenrouter", 8, 500.0)]) == []  # scrapes from before the counters
    raw = tmp_path / "raw-x"
    raw.mkdir()
    (raw / "record-0.json").write_text(json.dumps(tr))
    assert matrix.main(["--report", str(raw), "--by-shape"]) == 0
    assert "| tokenrouter | 8 | slm | 3 | 8 | overlapped | 20 | 2.50 | 8.00 |" in capsys.readouterr().out


def test_tables_ratios_and_prediction(tmp_path):
    recs = [record("tokenrouter", 4, 300.0, predicted=400.0), record("llm-only", 4, 150.0),
            record("lockstep", 4, 100.0), record("tokenrouter", 8, 500.0), record("eager", 8, 400.0)]  # fmt: skip
    text = matrix.tables(recs)
    assert "| TR / llm-only | 2.00x | - |" in text
    assert "| TR / lockstep | 3.00x | - |" in text
    assert "| TR / eager | - | 1.25x |" in text
    assert "| measured / predicted | 0.75x | - |" in text
    assert "| large-model share (TR) | 10.0 % | 10.0 % |" in text
    # a mode that gave the large model another share than TR's is flagged on its ratio
    recs[4]["report"]["tokens_per_model"] = {"slm": 85, "llm": 15}
    assert "| TR / eager | - | 1.25x (shares 10.0 / 15.0 %) |" in matrix.tables(recs)
    recs[4]["report"]["tokens_per_model"] = {"slm": 885, "llm": 115}  # within SHARE_GAP: no flag
    assert "| TR / eager | - | 1.25x |" in matrix.tables(recs)
    recs[4]["report"]["tokens_per_model"] = {"slm": 9, "llm": 1}
    assert "| eager | 8 | 1.0 | 2.00 | - / 3.00 | - |" in text  # a report with no p50 nor drain (older)
    recs[4]["report"] |= {"e2e_s": {"p50": 1.5, "p99": 3.0}, "drain_s": 0.25}
    assert (
        "| eager | 8 | 1.0 | 2.00 | 1.50 / 3.00 | 0.25 | {'slm': 9, 'llm': 1} | 2 | - | 20 |"
        in matrix.tables(recs)
    )
    raw = tmp_path / "raw-x"
    raw.mkdir()
    for i, r in enumerate(recs):
        (raw / f"record-{i}.json").write_text(json.dumps(r))
    with tarfile.open(tmp_path / "results-x.tar.gz", "w:gz") as tar:
        tar.add(raw, arcname=raw.name)
    assert matrix.load_records([str(tmp_path / "results-x.tar.gz")]) == recs
    assert matrix.load_records([str(raw)]) == recs


@pytest.mark.parametrize("bad", ["tokenrouter", "tokenrouter:", "warp:4"])
def test_bad_run_specs(bad):
    with pytest.raises(ValueError, match="MODE:N"):
        matrix.parse_runs([bad])


def test_time_table_from_metrics_deltas():
    rec = record("tokenrouter", 4, 300.0)
    rec["report"]["wall_s"] = 2.0
    m = 'tokenrouter_{}{{model="llm"}}'
    rec["metrics_before"] = {m.format("steps_total"): 10.0, m.format("step_seconds_total"): 0.5}
    rec["metrics_after"] = {m.format("steps_total"): 110.0, m.format("step_seconds_total"): 1.5,
                            m.format("step_rows_total"): 150.0, m.format("step_tokens_total"): 1200.0}  # fmt: skip
    assert matrix.step_deltas(rec)["llm"]["steps_total"] == 100.0
    assert (
        "| tokenrouter | 4 | llm | 100 | 1.00 | 50% | 10.00 | 1.50 | 12.00 | - | - | - | - |"
        in matrix.tables([rec])
    )
    rec["metrics_after"]['tokenrouter_slow_steps_by_batch_total{model="llm",bs="2"}'] = 2.0
    assert (
        "| tokenrouter | 4 | llm | 100 | 1.00 | 50% | 10.00 | 1.50 | 12.00 | 2 | - | - | - |"
        in matrix.tables([rec])
    )
    start = 'tokenrouter_step_starts_total{{model="llm",reason="{}"}}'
    rec["metrics_before"] |= {start.format("threshold"): 5.0, start.format("lowered"): 5.0}
    rec["metrics_after"] |= {start.format("threshold"): 85.0, start.format("lowered"): 15.0,
                             start.format("timeout"): 10.0}  # fmt: skip
    assert "| 10.00 | 1.50 | 12.00 | 2 | 80 / 10 / - / 10 | - | - |" in matrix.tables(
        [rec]
    )  # no held counter
    rec["metrics_after"][start.format("held")] = 0.0  # a server with the rule counts its starts, 0 here
    assert "| 10.00 | 1.50 | 12.00 | 2 | 80 / 10 / 0 / 10 | - | - |" in matrix.tables([rec])
    lone = 'tokenrouter_alone_steps_by_batch_total{{model="llm",bs="{}"}}'
    rec["metrics_before"] |= {lone.format(1): 4.0, m.format("step_gaps_total"): 10.0,
                              m.format("step_gap_seconds_total"): 0.01}  # fmt: skip
    rec["metrics_after"] |= {lone.format(1): 10.0, lone.format(3): 7.0, m.format("step_gaps_total"): 90.0,
                             m.format("step_gap_seconds_total"): 0.05}  # fmt: skip
    assert "| 2 | 80 / 10 / 0 / 10 | 13 | 0.50 | - |" in matrix.tables(
        [rec]
    )  # 6 + 7 alone; 40 ms over 80 gaps
    rec["metrics_before"] |= {m.format("hops_in_total"): 5.0, m.format("hop_delay_seconds_total"): 0.005}
    rec["metrics_after"] |= {m.format("hops_in_total"): 45.0, m.format("hop_delay_seconds_total"): 0.085}
    assert "| 2 | 80 / 10 / 0 / 10 | 13 | 0.50 | 2.00 |" in matrix.tables([rec])  # 80 ms over 40 hops


def test_r2r_plans_are_calibrated_to_the_route_share_unless_a_threshold_is_given(tmp_path):
    """The tiny pair on CPU: r2r's threshold is the calibrated one (calibration.json, the plan's param),
    or the one given; bernoulli has no threshold to calibrate."""
    s = matrix.Settings(out=tmp_path / "out", work=tmp_path / "work", device="cpu", output_len=16,
                        route_share=0.2, calibrate_prompts=3)  # fmt: skip
    raw = tmp_path / "raw"
    raw.mkdir()
    plan = json.loads(matrix.base_plan(s, "tiny", "r2r", raw).read_text())
    got = json.loads((raw / "calibration.json").read_text())
    assert got["wanted_share"] == 0.2 and got["positions"] == 3 * 16 and abs(got["share"] - 0.2) <= 0.05
    assert plan["params"]["threshold"]["value"] == got["threshold"]
    (raw / "calibration.json").unlink()
    s.r2r_threshold = "0.45"
    plan = json.loads(matrix.base_plan(s, "tiny", "r2r", raw).read_text())
    assert plan["params"]["threshold"]["value"] == 0.45 and not (raw / "calibration.json").exists()
    matrix.base_plan(s, "tiny", "bern0.35", raw)
    assert not (raw / "calibration.json").exists()


def test_n1_without_a_profile_is_served_at_b1_and_other_ns_fail(tmp_path, monkeypatch):
    """A low-share policy at N = 1 can leave the large model too few steps to profile (seen on the H200): N = 1 has
    only B = 1 to choose, so its plan is the base plan at B = 1, valid, with no prediction; any other N
    without a profile stops the part."""
    from tokenrouter.compiler.plan import read_plan

    s = matrix.Settings(out=tmp_path / "out", work=tmp_path / "work", device="cpu", output_len=16)
    raw = tmp_path / "raw"
    raw.mkdir()
    plan = matrix.base_plan(s, "tiny", "bern0.1", raw)
    monkeypatch.setattr(matrix, "profile_served", lambda s, plan, ns, raw: dict.fromkeys(ns))
    got = matrix.profile_and_tune(s, plan, [1], raw)[1]
    assert got["predicted_tok_s"] is None and set(got["thresholds"].values()) == {1}
    served = read_plan(got["plan"])
    assert {m["batch"] for m in served["models"].values()} == {1}
    assert served["policy"] == json.loads(plan.read_text())["policy"]
    with pytest.raises(RuntimeError, match="no profile at N = 4"):
        matrix.profile_and_tune(s, plan, [1, 4], raw)


def test_a_profile_with_latencies_alone_is_tuned_by_state_and_the_plain_choice_logged(tmp_path, monkeypatch):
    """An eager profile from a server with a busy board holds the latencies alone: `tune` takes them, and the
    script logs what the plain chain (the same profile without them) would have chosen."""
    from tokenrouter.throughput.inputs import StepLatency
    from tokenrouter.throughput.profile_format import Profile, write_profile

    s = matrix.Settings(out=tmp_path / "out", work=tmp_path / "work", device="cpu", output_len=16)
    raw = tmp_path / "raw"
    raw.mkdir()
    plan = matrix.base_plan(s, "tiny", "bern0.1", raw)
    beside = {"slm": StepLatency(((1, 2.4), (4, 2.8), (8, 3.0))), "llm": StepLatency(((1, 6.5), (8, 7.5)))}
    prof = Profile("bernoulli", None, beside, {"slm": {"slm": 0.65, "llm": 0.35}, "llm": {"slm": 1.0}},
                   alone_ms={"slm": StepLatency(((1, 1.5),))}, beside_ms={"slm": beside["slm"]})  # fmt: skip
    write_profile(prof, raw / "eager.json")
    monkeypatch.setattr(
        matrix, "profile_served", lambda s, plan, ns, raw: {n: raw / "eager.json" for n in ns}
    )
    got = matrix.profile_and_tune(s, plan, [8], raw)[8]
    tuned = json.loads((raw / "tune-n8.json").read_text())["tuning"]
    plain = json.loads((raw / "tune-n8-plain.json").read_text())["tuning"]
    assert tuned["alone"]["slm"]["co_runners"] == ["llm"] and "alone" not in plain
    assert got["thresholds"] == tuned["result"]["best"] != plain["result"]["best"]
    assert (
        s.log[-1].startswith("[")
        and "tune N=8 by state (latencies alone of slm); the plain chain would choose B = " in s.log[-1]
    )
    assert not json.loads((raw / "eager-plain.json").read_text()).get("alone_ms")


def narrow_eager_profile(s, tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(the tiny bern0.35 plan, its raw folder), with `profile_served` giving an eager profile that measured the
    large model at 1-2 rows only."""
    from tokenrouter.throughput.inputs import StepLatency
    from tokenrouter.throughput.profile_format import Profile, write_profile

    raw = tmp_path / "raw"
    raw.mkdir()
    plan = matrix.base_plan(s, "tiny", "bern0.35", raw)
    step = {"slm": StepLatency(((1, 2.4), (8, 3.0))), "llm": StepLatency(((1, 6.5), (2, 6.6)))}
    prof = Profile("bernoulli", None, step, {"slm": {"slm": 0.65, "llm": 0.35}, "llm": {"slm": 1.0}})
    write_profile(prof, raw / "eager.json")
    monkeypatch.setattr(
        matrix, "profile_served", lambda s, plan, ns, raw: {n: raw / "eager.json" for n in ns}
    )
    return plan, raw


def test_tunes_warnings_reach_the_console(tmp_path, monkeypatch):
    """A profile that measured the large model at 1-2 rows only: `tune` chooses B_llm beyond them and warns,
    and the script says so on its console, not only in tune.log."""
    s = matrix.Settings(out=tmp_path / "out", work=tmp_path / "work", device="cpu", output_len=16)
    plan, raw = narrow_eager_profile(s, tmp_path, monkeypatch)
    got = matrix.profile_and_tune(s, plan, [8], raw)[8]
    assert got["thresholds"]["llm"] > 2
    warned = [line for line in s.log if "tune N=8: warning: B_llm = " in line]
    assert warned and "measured up to 2 rows" in warned[0], s.log
    n_lines = len(s.log)
    matrix.fixed_tuning(s, plan, 8, {"slm": 1, "llm": 6}, got, raw)
    assert s.log[n_lines].startswith("[") and "fixed N=8: B = " in s.log[n_lines]
    assert "fixed N=8: warning: B_llm = 6: " in s.log[-1]


def test_simulation_as_the_run_was_explains_run_31():
    """run31.tar.gz (r2r, N = 16): one request of 48 had 506 of its 512 tokens on the 8B. The
    DTMC on the run's own step times (N alike requests) overshoots; the simulator given each request's own
    routing and the run's 48 requests comes within 0.9 of the measurement. Old records (no per_request)
    and non-routed modes give None."""
    recs = matrix.load_records([str(RUNS / "run31.tar.gz")])
    rec = next(r for r in recs if r["mode"] == "tokenrouter" and r["n"] == 16)
    measured = rec["report"]["decode_throughput_tok_s"]
    assert measured / matrix.run_prediction(rec) < 0.75
    assert 0.9 < measured / matrix.run_simulation(rec) < 1.0
    assert "simulated as the run was" in matrix.tables([rec])
    old = json.loads(json.dumps(rec))
    del old["report"]["per_request"]
    assert matrix.run_simulation(old) is None
    assert matrix.run_simulation(next(r for r in recs if r["mode"] == "llm-only")) is None
    # the simulator waits as long as the run's plans did (B = (11, 2) here: the timeout decides often)
    assert "max_delay_ms" not in rec  # before --max-delay-ms: the stdlib's 5 ms
    five = matrix.run_simulation(rec)
    assert matrix.run_simulation({**rec, "max_delay_ms": 5.0}) == five
    assert matrix.run_simulation({**rec, "max_delay_ms": 100.0}) < 0.9 * five


def test_the_simulation_as_the_run_was_waits_as_the_runs_servers_did():
    """run125.tar.gz (r2r, N = 4, B = (1, 2)): 13 of 16 requests sent the 8B nothing,
    and its servers waited for a partner at the 8B up to the timeout. The simulation of the run takes the
    runtime's rule that a model steps when every request it holds is queued only for records whose servers
    counted such starts: on this record, with the counter added, it serves more."""
    tarball = RUNS / "run125.tar.gz"
    rec = next(r for r in matrix.load_records([str(tarball)]) if r["mode"] == "tokenrouter")
    measured = rec["report"]["decode_throughput_tok_s"]
    as_served = matrix.run_simulation(rec)
    assert 0.93 < measured / as_served < 1.0  # 0.96x when the simulator was written
    held = json.loads(json.dumps(rec))
    held["metrics_after"]['tokenrouter_step_starts_total{model="llm",reason="held"}'] = 0.0
    assert matrix.run_simulation(held) > 1.02 * as_served


def test_the_hops_measured_delay_explains_most_of_the_gap_to_the_simulation():
    """run68.tar.gz (servers with IO threads per subserver): a hop took 0.72-1.30 ms from the
    sender's step end to the receiver's scheduler. The simulation of the run as it was, with hops instant,
    overshoots the served B = (2, 5) row by 1.19x; with each hop taking the mean delay measured into its
    target it comes within 0.95-1.0. Records without the hop counters have no such simulation."""
    tarball = RUNS / "run68.tar.gz"
    recs = matrix.load_records([str(tarball)])
    rec = next(r for r in recs if r["mode"] == "tokenrouter" and (r.get("thresholds") or {}).get("llm") == 5)
    measured = rec["report"]["decode_throughput_tok_s"]
    hop_ms = matrix.run_hop_ms(rec, ("slm", "llm"))
    assert hop_ms == pytest.approx((0.88, 0.72), abs=0.01)
    assert measured / matrix.run_simulation(rec) < 0.87
    assert 0.95 < measured / matrix.run_simulation(rec, hops=True) < 1.0
    text = matrix.tables(recs)
    assert "simulated as the run was, with its hops' measured delay" in text
    assert "simulated as the run was, with its hops' delay and host gaps" in text
    old = json.loads(json.dumps(rec))
    old["metrics_after"] = {
        k: v for k, v in old["metrics_after"].items() if "hop_delay" not in k and "hops_in" not in k
    }
    assert matrix.run_hop_ms(old, ("slm", "llm")) is None and matrix.run_simulation(old, hops=True) is None
    # with its host gaps too (0.095 ms a 0.6B step) the simulation comes nearer still; none without the gap counters
    gaps = matrix.run_simulation(rec, hops=True, gaps=True)
    assert 0.97 * matrix.run_simulation(rec, hops=True) < gaps < matrix.run_simulation(rec, hops=True)
    assert measured / matrix.run_simulation(rec, hops=True) < measured / gaps < 1.02
    old["metrics_after"] = {k: v for k, v in old["metrics_after"].items() if "step_gap" not in k}
    assert matrix.run_simulation(old, gaps=True) is None


def test_each_threshold_served_is_simulated_with_its_hops():
    """run78.tar.gz: (2, 7), at the edge Σ(B_i − 1) = N − 1, served at 0.86x of the
    DTMC on its own step times; its hops took 0.61-0.69 ms against 0.39-0.43 ms at (2, 5) and (2, 6). The
    simulation of each row as it was, with its hops' measured delay, comes within 0.94-1.0 of all three and
    orders them as they served; the threshold table gives it per row."""
    tarball = RUNS / "run78.tar.gz"
    recs = matrix.load_records([str(tarball)])
    table = matrix.threshold_table(recs)
    assert "| simulated, own step times and hops | measured / that |" in table[1]
    rows = {}  # B -> (measured, DTMC on own step times, the same with gaps, simulated with hops), as in the table
    for line in table[3:-1]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        b = tuple(int(x.split("=")[1]) for x in cells[1].split(","))
        rows[b] = (float(cells[3]), float(cells[6]), float(cells[8]), float(cells[10]))
    assert set(rows) == {(2, 5), (2, 6), (2, 7)}
    measured, own, gaps, simulated = ({b: v[k] for b, v in rows.items()} for k in range(4))
    assert measured[(2, 7)] / own[(2, 7)] < 0.88
    # the host gaps (0.1 ms a 0.6B step) bring the DTMC a little nearer each row, never past it
    assert all(measured[b] / own[b] < measured[b] / gaps[b] < 1.0 for b in rows)
    assert all(0.94 < measured[b] / simulated[b] < 1.0 for b in rows)
    assert sorted(rows, key=measured.get) == sorted(rows, key=simulated.get) == [(2, 7), (2, 5), (2, 6)]
    assert simulated[(2, 7)] == pytest.approx(matrix.run_simulation(
        next(r for r in recs if (r.get("thresholds") or {}).get("llm") == 7), hops=True), abs=0.05)  # fmt: skip


def test_fixed_thresholds_are_served_with_their_own_prediction(tmp_path, capsys):
    """`--thresholds llm=3`: a plan at those thresholds (the others as tuned), whose DTMC prediction comes
    from the tuning's profile through `tune` on a plan without auto models, and a table that sets each
    threshold's measured throughput beside its prediction and eager's."""
    from tokenrouter.compiler.plan import read_plan

    s = matrix.Settings(out=tmp_path / "out", work=tmp_path / "work", device="cpu", output_len=16)
    raw = tmp_path / "raw"
    raw.mkdir()
    plan = matrix.base_plan(s, "tiny", "bern0.35", raw)
    profile = tmp_path / "profile.json"  # step times and hops of run 41a (p = 0.35, N = 8), rounded
    profile.write_text(json.dumps({
        "format": "tokenrouter.profile/1", "policy": "bernoulli", "device": "serving metrics",
        "step_ms": {"slm": {str(b): ms for b, ms in enumerate([2.05, 2.31, 2.54, 2.65, 2.83, 2.91, 2.71, 1.54], 1)},
                    "llm": {str(b): ms for b, ms in enumerate([6.49, 6.68, 6.83, 6.84, 7.58, 7.47, 10.04], 1)}},
        "routing": {"slm": {"llm": 0.358, "slm": 0.642}, "llm": {"slm": 0.997, "llm": 0.003}},
    }))  # fmt: skip
    tuned = {"thresholds": {"slm": 1, "llm": 3}, "p": None, "step_ms": None, "profile": profile}
    got = matrix.fixed_tuning(s, plan, 8, {"llm": 5}, tuned, raw)
    assert got["fixed"] and got["thresholds"] == {"slm": 1, "llm": 5}
    served = read_plan(got["plan"])
    assert {m: spec["batch"] for m, spec in served["models"].items()} == {"slm": 1, "llm": 5}
    assert served["serve"]["concurrency"] == 8 and served["checks"]["feasibility"]["ok"]
    assert served["tuning"]["result"]["evaluated"] == 1  # just this candidate
    assert 1000 < got["predicted_tok_s"] < 2500
    other = matrix.fixed_tuning(s, plan, 8, {"llm": 2}, tuned, raw)
    assert other["predicted_tok_s"] != got["predicted_tok_s"]
    with pytest.raises(RuntimeError, match="infeasible at N = 4"):
        matrix.fixed_tuning(s, plan, 4, {"slm": 3, "llm": 3}, tuned, raw)
    with pytest.raises(RuntimeError, match="names 'big', not a model"):
        matrix.fixed_tuning(s, plan, 8, {"big": 2}, tuned, raw)
    assert matrix.parse_thresholds("slm=1, llm=4") == {"slm": 1, "llm": 4}
    for bad in ("llm", "llm=0", "llm=x", "=3"):
        with pytest.raises(ValueError, match="expected MODEL=B"):
            matrix.parse_thresholds(bad)
    assert (
        matrix.main(
            ["--pair", "tiny", "--policy", "bern0.1", "--run", "tokenrouter:4", "--thresholds", "llm"]
        )
        == 2
    )
    for bad, msg in ((["--colocation", "llm=3", "--tune-from", "profile"], "needs --tune-from eager"),
                     (["--colocation", "llm=0"], "--colocation 'llm=0': expected MODEL=B"),
                     (["--alone-from", "slm=2,llm=5", "--tune-from", "profile"], "--alone-from needs --tune-from eager"),
                     (["--alone-from", "slm=2,llm"], "--alone-from 'slm=2,llm': expected MODEL=B"),
                     (["--alone-from", "llm=5", "--colocation", "llm=3"], "give one"),
                     (["--served-from", "slm=2,llm=5", "--tune-from", "profile"], "--served-from needs --tune-from eager"),
                     (["--served-from", "tuned", "--tune-from", "profile"], "--served-from needs --tune-from eager"),
                     (["--served-from", "tune"], "--served-from 'tune': expected MODEL=B"),
                     (["--served-from", "llm=5", "--alone-from", "llm=5"],
                      "--alone-from and --served-from are ways to correct the eager profile: give one")):  # fmt: skip
        assert matrix.main(["--pair", "tiny", "--policy", "bern0.1", "--run", "tokenrouter:4", *bad]) == 2
        assert msg in capsys.readouterr().err

    recs = [record("tokenrouter", 8, 1600.0, predicted=1690.0), record("eager", 8, 1470.0)]
    recs[0]["thresholds"] = {"slm": 1, "llm": 3}
    assert matrix.threshold_table(recs) == []  # nothing served at fixed thresholds: no table
    fixed = record("tokenrouter", 8, 1650.0, predicted=1600.0) | {"fixed_thresholds": True,
                                                                  "thresholds": {"slm": 1, "llm": 5}}  # fmt: skip
    text = matrix.tables([*recs, fixed])
    assert "| tokenrouter | 1600.0 |" in text and "| TR / eager | 1.09x |" in text  # the tuned run's
    assert "| 8 | slm=1,llm=3 | tuned | 1600.0 | 1690.0 | 0.95x | - | - | - | - | - | - | 1.09x |" in text
    assert "| 8 | slm=1,llm=5 | fixed | 1650.0 | 1600.0 | 1.03x | - | - | - | - | - | - | 1.12x |" in text


def test_colocation_profiles_are_fitted_and_tuned_on(tmp_path, monkeypatch):
    """`--colocation llm=3`: the served profile of eager and of `serve --batch llm=3`, fitted into one by
    `profile --colocation`, with the plain tuner's choice logged beside it; where the fit fails, the eager
    profile alone (and the log says why)."""
    from tokenrouter.throughput.inputs import StepLatency
    from tokenrouter.throughput.profile_format import Profile, write_profile

    s = matrix.Settings(out=tmp_path / "out", work=tmp_path / "work", device="cpu", output_len=16,
                        colocation={"llm": 3})  # fmt: skip
    raw = tmp_path / "raw"
    raw.mkdir()
    plan = matrix.base_plan(s, "tiny", "bern0.1", raw)

    def served(llm_busy: float, slm_ms: float, tag: str) -> Path:
        prof = Profile("bernoulli", None, {"slm": StepLatency(((1, slm_ms), (2, slm_ms + 0.2))),
                                           "llm": StepLatency(((1, 6.5),))},
                       {"slm": {"slm": 0.9, "llm": 0.1}, "llm": {"slm": 1.0}},
                       {"slm": {"slm": 900, "llm": 100}, "llm": {"slm": 100}},
                       workload={"busy_share": {"slm": 0.4, "llm": llm_busy}, "generated_tokens": 1000})  # fmt: skip
        write_profile(prof, raw / f"{tag}.json")
        return raw / f"{tag}.json"

    calls = []

    def fake(s, plan, ns, raw, tag, extra):
        calls.append((tag, extra))
        return {n: served(0.69, 2.3, "eager") if tag == "eager" else served(0.45, 1.95, tag) for n in ns}

    monkeypatch.setattr(matrix, "served_profiles", fake)
    got = matrix.profile_served(s, plan, [8], raw)
    assert calls == [("eager", ()), ("B-llm3", ("--batch", "llm=3"))]
    assert got[8] == raw / "profile-n8-colocated.json"
    assert json.loads(got[8].read_text())["colocation"]["slm"]["ms_per_share"] == pytest.approx(
        1.4583, abs=1e-3
    )
    assert json.loads((raw / "tune-n8-plain.json").read_text())["tuning"]["result"]["best"]
    assert "co-location N=8 (eager and llm=3): slm: step +1.458 ms per unit of llm's busy share" in s.log[-1]
    assert "without it tune would choose B = " in s.log[-1]

    def same(s, plan, ns, raw, tag, extra):
        return {n: served(0.69, 2.3, tag) for n in ns}

    monkeypatch.setattr(matrix, "served_profiles", same)
    got = matrix.profile_served(s, plan, [8], raw)
    assert got[8] == raw / "eager.json"
    assert "profile failed (status 1); see tune.log; tuning on the eager profile alone" in s.log[-1]
    assert "about as busy in both profiles" in (raw / "tune.log").read_text()


def test_a_served_run_is_a_second_colocation_profile(tmp_path, capsys):
    """`--record-profile`: the profile of a served run's record, here run55.tar.gz's B = (1, 5), is a second
    profile for `profile --colocation`. Records of servers older than the uptime and threshold gauges lack
    them (as this one does): the profile is written with a warning. With them, the fit against the
    run's eager profile puts the 0.6B's slope on the chain's scale at 1.20 ms per unit of the 8B's
    utilization, where the run's own second profile at B_llm = 3 gave 0.84."""
    from tokenrouter.throughput.colocation import fit
    from tokenrouter.throughput.plan_inputs import system_from_plan
    from tokenrouter.throughput.profile_format import read_profile

    tarball = RUNS / "run55.tar.gz"
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path, filter="data")
    raw = next(tmp_path.glob("raw-*"))
    plan = json.loads((raw / "0.6b+8b-bern0.35.plan").read_text())
    rec = json.loads((raw / "record-tokenrouter-n8-B1-5.json").read_text())
    assert rec["thresholds"] == {"slm": 1, "llm": 5}
    old = tmp_path / "old.json"
    old.write_text(json.dumps(rec))
    assert matrix.main(["--record-profile", str(old), str(tmp_path / "old-profile.json")]) == 0
    assert "no busy_share or thresholds" in capsys.readouterr().err
    for m, b in rec["thresholds"].items():  # what a record of today's matrix.py keeps
        rec["metrics_before"][f'tokenrouter_uptime_seconds_total{{model="{m}"}}'] = 0.0
        rec["metrics_after"][f'tokenrouter_uptime_seconds_total{{model="{m}"}}'] = rec["report"]["wall_s"]
        rec["metrics_after"][f'tokenrouter_batch_threshold{{model="{m}"}}'] = float(b)
    new = tmp_path / "new.json"
    new.write_text(json.dumps(rec))
    assert matrix.main(["--record-profile", str(new), str(tmp_path / "b15.json")]) == 0
    assert "warning" not in capsys.readouterr().err
    b15 = read_profile(tmp_path / "b15.json")
    assert b15.workload["thresholds"] == {"slm": 1, "llm": 5}
    assert b15.workload["busy_share"]["llm"] == pytest.approx(0.58, abs=0.01)  # the time table's 58 %
    eager = read_profile(raw / "profile-n8.json")
    slope = {}
    for name, second in (("B-llm3", read_profile(raw / "profile-n8-B-llm3.json")), ("B15", b15)):
        system = system_from_plan(plan, 8, profile=fit(plan, eager, second))
        slope[name] = system.inputs.colocation[0].ms_per_share
    assert slope["B-llm3"] == pytest.approx(0.84, abs=0.01)
    assert slope["B15"] == pytest.approx(1.20, abs=0.01)
    # a record without a profile: a message, not a traceback
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**rec, "mode": "llm-only"}))
    assert matrix.main(["--record-profile", str(bad), str(tmp_path / "x.json")]) == 2
    assert "no profile in this record" in capsys.readouterr().err
    assert matrix.main(["--record-profile", str(tmp_path / "none.json"), str(tmp_path / "x.json")]) == 2


def _second_profile_setup(tmp_path, monkeypatch):
    """run76.tar.gz's eager scrapes (H200) in `raw`, with run75.tar.gz's served (2, 5) row as the second
    served profile that `served_profiles` (faked) returns: (raw, plan, donor profile, the fake's calls)."""
    from tokenrouter.throughput.profile_format import write_profile

    def archive(run: str) -> dict[str, bytes]:
        with tarfile.open(RUNS / f"{run}.tar.gz") as tar:
            return {Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}

    run76, run75 = archive("run76"), archive("run75")
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("profile-metrics-n8-after.txt", "profile-metrics-n8-before.txt", "profile-n8.json",
                 "0.6b+8b-bern0.35.plan"):  # fmt: skip
        (raw / name).write_bytes(run76[name])
    plan = raw / "0.6b+8b-bern0.35.plan"
    donor = matrix.record_profile(json.loads(run75["record-tokenrouter-n8-B2-5.json"]), 20)
    write_profile(donor, raw / "second.json")
    calls = []

    def fake(s, plan, ns, raw, tag, extra):
        calls.append((tag, extra))
        return {n: raw / ("profile-n8.json" if tag == "eager" else "second.json") for n in ns}

    monkeypatch.setattr(matrix, "served_profiles", fake)
    return raw, plan, donor, calls


def _served_second(tmp_path, monkeypatch, suffix: str, **lend):
    """`profile_served` with the second profile of `_second_profile_setup` lent as `lend` says (`alone_from=` or
    `served_from=` (2, 5)): (settings, raw, plan, donor, the profiles per N), after checking that the second
    profile was served at (2, 5) and the profile tuned on is `profile-n8-SUFFIX.json`."""
    raw, plan, donor, calls = _second_profile_setup(tmp_path, monkeypatch)
    s = matrix.Settings(out=tmp_path / "out", work=tmp_path / "work", device=None, **lend)
    got = matrix.profile_served(s, plan, [8], raw)
    assert calls == [("eager", ()), ("B-slm2,llm5", ("--batch", "slm=2", "--batch", "llm=5"))]
    assert got[8] == raw / f"profile-n8-{suffix}.json"
    return s, raw, plan, donor, got


def test_latencies_alone_lent_by_a_second_served_profile(tmp_path, monkeypatch):
    """`--alone-from slm=2,llm=5`, on run76.tar.gz's eager scrapes (H200) with run75.tar.gz's (2, 5) row as
    the second served profile: the eager profile is built again with the second one's latencies alone (the
    0.6B's at 2-8 rows, where the eager profile had them at 1, 2, 3 and 5 only), tuned on, and the log says
    what the eager profile's own latencies alone chose ((1, 4), as the tuning in that archive did)."""
    from tokenrouter.throughput.profile_format import read_profile

    s, raw, plan, donor, got = _served_second(tmp_path, monkeypatch, "alone", alone_from={"slm": 2, "llm": 5})
    lent, eager = read_profile(got[8]), read_profile(raw / "profile-n8.json")
    assert lent.alone_ms["slm"] == donor.alone_ms["slm"] and lent.step_ms == eager.step_ms
    assert sorted(b for b, _ in eager.alone_ms["slm"].points) == [1, 2, 3, 5]
    assert lent.workload["alone_measured"] == ["slm", "llm"]
    assert "latencies alone N=8 from the plan served at slm=2,llm=5; with the eager profile's own, tune would " \
           "choose B = {'slm': 1, 'llm': 4}" in s.log[-1]  # fmt: skip
    assert "slm: alone from" in (raw / "tune.log").read_text()
    # no second profile: the eager one, said so
    monkeypatch.setattr(matrix, "served_profiles", lambda s, plan, ns, raw, tag, extra: {
        n: raw / "profile-n8.json" if tag == "eager" else None for n in ns})  # fmt: skip
    assert matrix.profile_served(s, plan, [8], raw)[8] == raw / "profile-n8.json"
    assert "no profile at slm=2,llm=5 or no eager one; tuning on the eager profile" in s.log[-1]


def test_latencies_of_a_second_served_profile_merged_into_the_eager_one(tmp_path, monkeypatch):
    """`--served-from slm=2,llm=5` on the same scrapes: the eager profile is built again with every latency the
    second profile measured (`profile --merge`), alone and beside, at its batch sizes, and tuned on."""
    from tokenrouter.throughput.profile_format import read_profile

    s, raw, plan, donor, got = _served_second(
        tmp_path, monkeypatch, "merged", served_from={"slm": 2, "llm": 5}
    )
    merged, eager = read_profile(got[8]), read_profile(raw / "profile-n8.json")
    mine, theirs = dict(merged.step_ms["slm"].points), dict(donor.step_ms["slm"].points)
    assert theirs and all(mine[b] == ms for b, ms in theirs.items())
    # latencies alone: the second profile's (a row's record, not fitted: 1.64 ms at 3 rows, 1.56 at 4), fitted
    # non-decreasing with the eager profile's where it was (`workload.merged_alone_pooled`), as measured elsewhere
    mine, theirs = dict(merged.alone_ms["slm"].points), dict(donor.alone_ms["slm"].points)
    pooled = {b for sizes in merged.workload.get("merged_alone_pooled", {}).get("slm", []) for b in sizes}
    assert pooled and all(mine[b] == ms for b, ms in theirs.items() if b not in pooled)
    assert list(mine.values()) == sorted(mine.values())
    assert merged.routing == eager.routing and merged.workload["merged_from"] == str(raw / "second.json")
    assert "latencies N=8 from the plan served at slm=2,llm=5; with the eager profile's own, tune would " \
           "choose B = {'slm': 1, 'llm': 4}" in s.log[-1]  # fmt: skip
    assert "slm: latencies at batch sizes" in (raw / "tune.log").read_text()


def test_tuning_in_two_passes_serves_the_second_profile_at_the_eager_choice(tmp_path, monkeypatch):
    """`--served-from tuned`: the second profile is served per N at the thresholds the eager profile chooses (run
    76's chose (1, 4)), and merged into the eager profile as with fixed thresholds."""
    raw, plan, donor, calls = _second_profile_setup(tmp_path, monkeypatch)
    s = matrix.Settings(
        out=tmp_path / "out", work=tmp_path / "work", device=None, served_from=matrix.TWO_PASS
    )
    got = matrix.profile_served(s, plan, [8], raw)
    assert calls == [("eager", ()), ("B-slm1,llm4", ("--batch", "slm=1", "--batch", "llm=4"))]
    assert got[8] == raw / "profile-n8-merged.json"
    assert "latencies N=8 from the plan served at slm=1,llm=4; with the eager profile's own, tune would " \
           "choose B = {'slm': 1, 'llm': 4}" in s.log[-1]  # fmt: skip
    assert (raw / "tune-n8-eager-unmerged.json").exists()
    # where the eager profile chooses B = 1 everywhere there is no second profile to serve
    calls.clear()
    monkeypatch.setattr(
        matrix, "plain_tune", lambda *a, **k: {"best": {"slm": 1, "llm": 1}, "throughput_tok_s": 1.0}
    )
    assert matrix.profile_served(s, plan, [8], raw)[8] == raw / "profile-n8.json"
    assert calls == [("eager", ())] and "the eager profile chooses B = 1; tuning on it" in s.log[-1]


def test_simulate_at_other_thresholds_keeps_each_rows_routing():
    """`--report --simulate-at`: each row simulated as it was, at its own thresholds and at others. On run125.tar.gz
    (r2r, N = 4) eager at its own B = (1, 1) is the same simulation as at (1, 1), and at (1, 2) it serves less:
    the hop waits for a partner that seldom comes (those servers had no "held" rule)."""
    tarball = RUNS / "run125.tar.gz"
    recs = [r for r in matrix.load_records([str(tarball)]) if r["mode"] in ("eager", "llm-only")]
    lines = matrix.whatif_table(recs, [{"slm": 1, "llm": 1}, {"llm": 2}])
    assert lines[1] == "| mode | N | tok/s | simulated | at slm=1,llm=1 | at llm=2 |"
    (row,) = [x for x in lines if x.startswith("| eager | 4 |")]  # llm-only rows are left out
    cells = row.split(" | ")
    assert cells[4].endswith("(1.000x)") and cells[3] == cells[4].split(" ")[0]
    assert float(cells[5].split("(")[1].rstrip("x) |")) < 0.97
    assert matrix.whatif_table([r for r in recs if r["mode"] == "llm-only"], [{"llm": 2}]) == []


def test_a_malformed_simulate_at_fails_before_the_report_prints(capsys):
    tarball = RUNS / "run125.tar.gz"
    assert matrix.main(["--report", str(tarball), "--simulate-at", "llm=0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "error: --simulate-at 'llm=0': expected MODEL=B" in err


def test_simulate_held_away_is_a_what_if_of_the_held_rule(capsys):
    """`--report --simulate-held-away MS`: each row simulated as it was, with a request away from a model for
    longer than MS no longer held there (`SimConfig.held_away_ms`). On run128.tar.gz (r2r, N = 4, servers with
    the held rule) the tuned row's 8B waited for requests that had left for good: not waiting for any request
    away serves more; eager (B = 1) never waits, so it is unchanged. run125.tar.gz's servers had no held rule:
    no cell."""
    run128 = RUNS / "run128.tar.gz"
    recs = [
        r for r in matrix.load_records([str(run128)]) if r["mode"] == "eager" or not r.get("fixed_thresholds")
    ]
    lines = matrix.whatif_table(recs, [], (0.0,))
    assert lines[1] == "| mode | N | tok/s | simulated | held away < 0 ms |"
    ratios = {row.split(" | ")[0]: float(row.split("(")[-1].rstrip("x) |")) for row in lines[3:] if row}
    assert ratios["| eager"] == 1.0 and ratios["| tokenrouter"] > 1.02
    run125 = RUNS / "run125.tar.gz"
    eager125 = [r for r in matrix.load_records([str(run125)]) if r["mode"] == "eager"]
    assert matrix.whatif_table(eager125, [], (0.0,))[3].endswith("| - |")
    assert matrix.main(["--report", str(run125), "--simulate-held-away", "-1"]) == 2
    # `--simulate-held-expect`: a bound no wait reaches steps at once, as a horizon of 0 ms does
    both = matrix.whatif_table(recs, [], (0.0,), (1e9,))
    assert both[1].endswith("| held away < 0 ms | held expect < 1e+09 |")
    rows = [row for row in both[3:] if row]
    assert len(rows) == 2 and all(row.split(" | ")[-2] == row.split(" | ")[-1].rstrip(" |") for row in rows)
    assert matrix.main(["--report", str(run125), "--simulate-held-expect", "0"]) == 2
    assert "--simulate-held-expect '0': expected a number of rows > 0" in capsys.readouterr().err
    assert matrix.main(["--report", str(run125), "--simulate-held-expect", "x"]) == 2
    assert "--simulate-held-expect 'x': expected a number of rows > 0" in capsys.readouterr().err


def test_tuning_at_the_rate_ranks_by_latency_within_the_measured_batch_sizes(tmp_path, monkeypatch, capsys):
    """`--tune-at-rate`: each N is tuned by `tune --request-rate` on the same profile, which ranks the candidates
    priced beyond the measured batch sizes last; a fixed threshold beyond them is still simulated, and warned."""
    assert (
        matrix.main(["--pair", "tiny", "--policy", "bern0.1", "--run", "tokenrouter:4", "--tune-at-rate"])
        == 2
    )
    assert "--tune-at-rate needs --request-rate" in capsys.readouterr().err
    s = matrix.Settings(out=tmp_path / "out", work=tmp_path / "work", device="cpu", output_len=16,
                        request_rate=20.0, tune_at_rate=True)  # fmt: skip
    plan, raw = narrow_eager_profile(s, tmp_path, monkeypatch)
    real_load = matrix.tune_load  # the rate tuner over a fifth of its default simulated time: the same checks
    monkeypatch.setattr(
        matrix, "tune_load", lambda s, profile: (*real_load(s, profile), "--horizon-ms", "60000")
    )
    served = json.loads((raw / "eager.json").read_text())  # a served profile measures the hops' delay too
    measured = {"hop_ms": {"slm": 0.4, "llm": 0.3}, "gap_ms": {"slm": 0.1}}
    (raw / "eager.json").write_text(json.dumps(served | {"workload": measured}))
    got = matrix.profile_and_tune(s, plan, [8], raw)[8]
    result = json.loads((raw / "tune-n8.json").read_text())["tuning"]["result"]
    assert result["objective"] == "from-arrival-p99" and result["request_rate_per_s"] == 20.0
    assert result["hop_ms"] == {"slm": 0.4, "llm": 0.3} and result["gap_ms"] == {"slm": 0.1, "llm": 0.0}
    assert got["thresholds"] == result["best"] and got["thresholds"]["llm"] <= 2
    said = [line for line in s.log if "tune N=8: B = " in line]
    assert said and "(simulated from-arrival-p99 " in said[0] and " ms at 20 requests/s)" in said[0], s.log
    n_lines = len(s.log)
    fixed = matrix.fixed_tuning(s, plan, 8, {"slm": 1, "llm": 6}, got, raw)
    assert fixed["thresholds"] == {"slm": 1, "llm": 6}
    # simulated as given; warned exactly when more than 5 % of its llm steps ran above the 2 rows measured
    (only,) = json.loads((raw / "tune-tiny-bern0.35-n8-B1-6.json").read_text())["tuning"]["result"][
        "candidates"
    ]
    warned = [line for line in s.log[n_lines:] if "fixed N=8: warning: B* = slm 1, llm 6: " in line]
    assert bool(warned) == (only["beyond_measured"]["llm"] > 0.05) and only["beyond_measured"]["llm"] > 0
    assert all("llm's simulated steps had more than 2 rows" in line for line in warned)
