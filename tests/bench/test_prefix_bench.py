"""bench/prefix_bench.py without a server: the plan it serves (bernoulli p = 0.1, B = (1, 2)), the loads it sends,
and its side-by-side tables with their ratios; `--keep` adds an earlier call's reports."""

from __future__ import annotations

import json
import subprocess
import types
from pathlib import Path

import pytest


@pytest.fixture
def pb(bench_script):
    return bench_script("prefix_bench")


def report(tok_s: float, ttft: float, by_turn=None, hits=None) -> dict:
    rep = {
        "decode_throughput_tok_s": tok_s,
        "ttft_ms": {"p50": ttft, "p99": 2 * ttft},
        "completed": 1,
        "requests": 1,
        "failed": 0,
        "errors": [],
    }
    if by_turn:
        rep["ttft_ms_by_turn"] = {str(k): {"p50": v} for k, v in by_turn.items()}
    rep["prefix_cache"] = hits or {}
    return rep


def fake_servers(pb, monkeypatch) -> list[tuple[str, list[str], str]]:
    """Replace the script's `Server` with one that starts nothing; returns the list each start appends its
    (plan, serve arguments, log file name) to."""
    served = []

    class FakeServer:
        def __init__(self, plan, args, log):
            served.append((str(plan), list(args), Path(log).name))
            self.url = "http://fake"

        def stop(self):
            pass

    monkeypatch.setattr(pb, "Server", FakeServer)
    return served


def fake_tune(cmd: list[str]) -> types.SimpleNamespace:
    """`tokenrouter profile / tune / simulate` as the auto flow runs them: `tune` writes a plan tuned to B = (2, 7)
    at 20 ms; every command's stdout is `simulate`'s JSON."""
    if cmd[3] == "tune":
        Path(cmd[cmd.index("-o") + 1]).write_text(json.dumps({"models": {"slm": {"batch": 2}, "llm": {"batch": 7}},
                                                              "serve": {"max_delay_ms": 20.0}}))  # fmt: skip
    return types.SimpleNamespace(stdout=json.dumps({"simulation": {"throughput_tok_s": 88.0}}))


def test_the_plan_and_the_loads(pb, tmp_path):
    from tokenrouter.compiler.plan import read_plan

    plan = read_plan(pb.make_plan(tmp_path, quick=True, device="cpu"))
    assert {x: s["batch"] for x, s in plan["models"].items()} == {"slm": 1, "llm": 2}
    assert plan["entry"] == "slm" and plan["checks"]["feasibility"]["ok"]
    auto = read_plan(pb.make_plan(tmp_path, quick=True, device="cpu", auto=True))
    assert {x: s["batch"] for x, s in auto["models"].items()} == {"slm": "auto", "llm": "auto"}
    assert auto["checks"]["feasibility"]["ok"]
    z = pb.Sizes()
    shared = pb.load_spec("shared", "http://x", z)
    assert (shared.shared_prefix_len, shared.prompt_len, shared.num_prompts, shared.output_len, shared.concurrency) == (
        3000, 24, 32, 128, 8)  # fmt: skip
    chat = pb.load_spec("chat", "http://x", z)
    assert (chat.turns, chat.system_len, chat.output_len, chat.concurrency) == (8, 1000, 200, 16)
    paper = pb.load_spec("paper", "http://x", z)
    assert (paper.prompt_len, paper.concurrency, paper.shared_prefix_len, paper.turns) == (64, 4, 0, 0)


def test_tables_put_the_deployments_side_by_side(pb):
    z = pb.QUICK
    on = {"slm": {"enabled": True, "hit_rate": 0.9}, "llm": {"enabled": True, "hit_rate": 0.5}}
    results = {
        ("TokenRouter", "shared"): report(300.0, 20.0, hits=on),
        ("std-serving", "shared"): report(200.0, 25.0, hits=on),
        ("llm-only", "shared"): report(100.0, 30.0),
        ("TokenRouter", "chat"): report(150.0, 40.0, {1: 40.0, 2: 44.0, 3: 50.0}),
        ("llm-only", "chat"): report(75.0, 80.0, {1: 80.0, 2: 90.0, 3: 100.0}),
        ("TokenRouter, B llm 8", "chat"): report(120.0, 30.0, {1: 30.0, 2: 30.0, 3: 60.0}),
        ("SGLang, 8B alone", "chat"): report(120.0, 20.0, {1: 20.0, 2: 22.0, 3: 24.0}),
        ("SGLang, 8B alone", "shared"): report(250.0, 22.0),
        ("TokenRouter", "paper"): report(99.0, 10.0),
        ("TokenRouter, no cache", "paper"): report(
            100.0, 10.0, hits={"slm": {"enabled": False, "hit_rate": 0}}
        ),
    }
    text = pb.tables(results, z)
    assert "| TokenRouter | 300.0 | 20.0 | 40.0 | 1.00x | slm 90%, llm 50% |" in text
    assert (
        "| std-serving | 200.0 | 25.0 | 50.0 | 1.50x |" in text
        and "| llm-only | 100.0 | 30.0 | 60.0 | 3.00x | - |" in text
    )
    # chat rows: each deployment against llm-only
    assert "| TokenRouter | 150.0 | 2.00x | 1.00x | 40.0 | 44.0 | 50.0 | 1.25 |" in text
    assert "| TokenRouter, B llm 8 | 120.0 | 1.60x | 1.25x | 30.0 | 30.0 | 60.0 | 2.00 |" in text
    assert "| llm-only | 75.0 | 1.00x | 2.00x | 80.0 | 90.0 | 100.0 | 1.25 |" in text
    # SGLang on the 8B alone: TokenRouter against it, in both loads
    assert "| SGLang, 8B alone | 120.0 | 1.60x | 1.25x | 20.0 | 22.0 | 24.0 | 1.20 | - |" in text
    assert "| SGLang, 8B alone | 250.0 | 22.0 | 44.0 | 1.20x | - |" in text
    assert "| TokenRouter | 99.0 | 10.0 | 0.99x |" in text and "slm off" in text


def test_keep_adds_an_earlier_calls_reports(pb, tmp_path, monkeypatch):
    earlier = [{"deployment": "llm-only", "load": "shared", "report": report(50.0, 9.0)},
               {"deployment": "std-serving", "load": "shared", "report": report(70.0, 9.0)}]  # fmt: skip
    (tmp_path / "prefix-bench.json").write_text(json.dumps({"sizes": {}, "runs": earlier}))
    served = fake_servers(pb, monkeypatch)

    async def fake_load(spec):
        return report(80.0, 5.0)

    monkeypatch.setattr(pb, "make_plan", lambda out, quick, device: out / "x.plan")
    monkeypatch.setattr("tokenrouter.loadgen.bench.run_load", fake_load)
    assert pb.main(["--out", str(tmp_path), "--quick", "--keep", "--only", "std-serving"]) == 0
    assert all(args[0] == "--mode" and args[2] == "--device" for _, args, _ in served)
    assert [(args[1], tuple(args[4:])) for _, args, _ in served] == [("std-serving", ())]
    runs = {
        (r["deployment"], r["load"]): r["report"]
        for r in json.loads((tmp_path / "prefix-bench.json").read_text())["runs"]
    }
    assert runs[("llm-only", "shared")]["decode_throughput_tok_s"] == 50.0  # kept
    assert runs[("std-serving", "shared")]["decode_throughput_tok_s"] == 80.0  # measured again
    assert "| llm-only | 50.0 |" in (tmp_path / "prefix-bench.md").read_text()


def test_a_tagged_variant_serves_with_its_flags_beside_the_untagged_rows(pb, tmp_path, monkeypatch):
    """`--serve-arg` reaches every TokenRouter `serve` of the call (both of the auto flow's), not SGLang's server;
    `--tag` records the deployments as 'NAME [TAG]', whose rows follow the untagged ones in the tables and are
    compared with the same baselines."""
    earlier = [{"deployment": "llm-only", "load": "chat", "report": report(50.0, 9.0)},
               {"deployment": "TokenRouter, auto", "load": "chat", "report": report(70.0, 9.0)}]  # fmt: skip
    (tmp_path / "prefix-bench.json").write_text(json.dumps({"sizes": {}, "runs": earlier}))
    served = fake_servers(pb, monkeypatch)

    async def fake_load(spec):
        return report(90.0, 5.0)

    monkeypatch.setattr(pb, "make_plan", lambda out, quick, device, auto=False: out / f"x-auto-{auto}.plan")
    monkeypatch.setattr("tokenrouter.loadgen.bench.run_load", fake_load)
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: fake_tune(cmd))
    monkeypatch.setattr("httpx.get", lambda url, timeout: types.SimpleNamespace(text="{}"))
    args = ["--out", str(tmp_path), "--quick", "--keep", "--load", "chat", "--only", "TokenRouter, auto",
            "--only", "SGLang, 8B alone", "--serve-arg=--mps-sm=llm=60", "--tag", "60 %"]  # fmt: skip
    assert pb.main(args) == 1  # SGLang is not installed here: that deployment fails, the other is measured
    flag = ("--mps-sm=llm=60",)
    assert [(args[1], tuple(args[4:]), log) for _, args, log in served] == [
        ("eager", flag, "tokenrouter-auto-60-eager.stderr"), ("tokenrouter", flag, "tokenrouter-auto-60-chat.stderr")]  # fmt: skip
    runs = [(r["deployment"], r["report"]["decode_throughput_tok_s"])
            for r in json.loads((tmp_path / "prefix-bench.json").read_text())["runs"]]  # fmt: skip
    assert runs == [("llm-only", 50.0), ("TokenRouter, auto", 70.0), ("TokenRouter, auto [60 %]", 90.0)]
    text = (tmp_path / "prefix-bench.md").read_text()
    auto_row = text.index("| TokenRouter, auto | 70.0 | 1.40x |")
    assert text.index("| TokenRouter, auto [60 %] | 90.0 | 1.80x | 0.78x |") > auto_row
    with pytest.raises(SystemExit):
        pb.main(["--out", str(tmp_path), "--quick", "--tag", "a [b]"])


def test_the_sglang_deployment_says_why_it_cannot_start(pb, tmp_path):
    with pytest.raises(RuntimeError, match="holds no sglang package"):
        pb.SGLangServer(str(tmp_path), tmp_path / "sglang.stderr", sglang_path=str(tmp_path))


def test_repeats_run_each_load_with_its_own_prompts_and_report_the_median(pb, tmp_path, monkeypatch):
    seeds = []
    fake_servers(pb, monkeypatch)

    async def fake_load(spec):
        seeds.append(spec.seed)
        return report({1: 90.0, 11: 70.0, 21: 100.0}[spec.seed], 5.0)

    monkeypatch.setattr(pb, "make_plan", lambda out, quick, device: out / "x.plan")
    monkeypatch.setattr("tokenrouter.loadgen.bench.run_load", fake_load)
    args = ["--out", str(tmp_path), "--quick", "--only", "llm-only, no cache", "--repeats", "3"]
    assert pb.main(args) == 0
    assert seeds == [1, 11, 21]  # the shared load three times, other prompts each time (no cache hits across)
    rep = json.loads((tmp_path / "prefix-bench.json").read_text())["runs"][0]["report"]
    assert rep["decode_throughput_tok_s"] == 90.0 and rep["repeats_tok_s"] == [90.0, 70.0, 100.0]
    assert "| llm-only, no cache | 90.0 (70-100) |" in (tmp_path / "prefix-bench.md").read_text()
    with pytest.raises(SystemExit):
        pb.main(["--out", str(tmp_path), "--quick", "--repeats", "0"])


def test_auto_tunes_each_load_by_the_users_flow(pb, tmp_path, monkeypatch):
    """`TokenRouter, auto`: the plan served eager runs each load, `profile --from-metrics` and `tune -n N` (N: the
    load's concurrency) make the tuned plan, which is served and runs the load again; the rows show the tuned
    thresholds and the simulator's figure."""
    served, commands = fake_servers(pb, monkeypatch), []

    async def fake_load(spec):
        return report(90.0 if "tuned" in served[-1][0] else 30.0, 5.0)

    def fake_run(cmd, **kw):
        verb = cmd[3]
        assert verb == "simulate" or cmd[4].endswith(
            "x-auto-True.plan"
        )  # profile, tune: the plan at batch: auto
        commands.append((verb, cmd[cmd.index("-n") + 1] if "-n" in cmd else None))
        if verb == "tune":
            assert "--tune-delay" in cmd  # the timeout is tuned with the thresholds
        return fake_tune(cmd)

    monkeypatch.setattr(pb, "make_plan", lambda out, quick, device, auto=False: out / f"x-auto-{auto}.plan")
    monkeypatch.setattr("tokenrouter.loadgen.bench.run_load", fake_load)
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr("httpx.get", lambda url, timeout: types.SimpleNamespace(text="{}"))
    assert pb.main(["--out", str(tmp_path), "--quick", "--only", "TokenRouter, auto"]) == 0
    assert [args[1] for _, args, _ in served] == ["eager", "tokenrouter", "tokenrouter"]
    assert served[0][0].endswith("x-auto-True.plan")  # the eager profile serves the plan tune will tune
    assert served[1][0].endswith("auto-tuned-shared.plan") and served[2][0].endswith("auto-tuned-chat.plan")
    z = pb.QUICK
    assert commands == [("profile", None), ("tune", str(z.shared_c)), ("simulate", str(z.shared_c)),
                        ("profile", None), ("tune", str(z.conversations)), ("simulate", str(z.conversations))]  # fmt: skip
    text = (tmp_path / "prefix-bench.md").read_text()
    assert "| TokenRouter, auto | 90.0 |" in text and "B slm 2, llm 7, 20 ms; simulated 88.0" in text


def test_where_the_time_went_and_the_bytes_read(pb):
    """Tables (d) and (e) from each run's `steps_by_model`: bytes = steps x (weights + rows x mean context x KV
    bytes per token), per output token and per second, and the 8B alone's bytes per token over each run's."""
    z = pb.Sizes()
    ctx = pb.mean_context("chat", z)
    assert ctx == 1000 + 3.5 * 250 + 50 + 100
    sizes = {"slm": (1_000_000_000, 100_000), "llm": (16_000_000_000, 150_000)}

    def run(tok_s, steps):
        rep = report(tok_s, 10.0) | {"output_tokens": 1000, "wall_s": 2.0}
        rep["steps_by_model"] = {m: {"steps": n, "ms_per_step": 1.5, "rows_per_step": r, "tokens_per_step": 2 * r,
                                     "busy": 0.5} for m, (n, r) in steps.items()}  # fmt: skip
        return rep

    results = {("TokenRouter", "chat"): run(200.0, {"slm": (900, 10.0), "llm": (100, 2.0)}),
               ("llm-only", "chat"): run(100.0, {"llm": (1000, 16.0)})}  # fmt: skip
    text = pb.tables(results, z, sizes)
    assert "| TokenRouter | chat | slm | 900 | 1.50 | 10.00 | 20.0 | 50% |" in text
    tr = (900 * (1e9 + 10 * ctx * 1e5) + 100 * (16e9 + 2 * ctx * 1.5e5)) / 1000
    alone = 1000 * (16e9 + 16 * ctx * 1.5e5) / 1000
    assert f"| TokenRouter | chat | {tr / 1e9:.3f} | {tr * 1000 / 2 / 1e12:.2f} | {alone / tr:.2f} |" in text
    assert f"| llm-only | chat | {alone / 1e9:.3f} | {alone * 1000 / 2 / 1e12:.2f} | 1.00 |" in text
    assert "(e)" not in pb.tables(results, z)  # no model sizes: no estimate
