"""The Scheduler core driven message by message: unseen-suffix hops, extends on return, tombstones, errors."""

from __future__ import annotations

import time

import msgspec
import pytest
import torch
from subserver_helpers import SpyEngine, all_free, compile_policy

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.engine.embedded import load_engine
from tokenrouter.runtime.route import RouteKernel, RouteResult
from tokenrouter.runtime.subserver.batching import BatchingConfig
from tokenrouter.runtime.subserver.busy_board import BusyBoard, create_board
from tokenrouter.runtime.subserver.scheduler import FRONTEND, Scheduler

SPEC = m.SamplingSpec(seed=7, max_tokens=200, ignore_eos=True)


@pytest.fixture
def pair(tmp_path):
    plan = compile_policy(tmp_path, "keep")
    engines = {n: SpyEngine(load_engine(plan["models"][n]["path"])) for n in "ab"}
    cfg = BatchingConfig({"a": 1, "b": 1}, 0.0)
    return {
        n: Scheduler(n, plan, engines[n], RouteKernel(plan, n, "torch", "cpu"), batching=cfg) for n in "ab"
    }


def run_until_hop(sched: Scheduler, limit: int = 200) -> m.PeerRequest:
    for _ in range(limit):
        hops = [msg for dest, msg in sched.step() if dest != FRONTEND]
        if hops:
            return hops[0]
    raise AssertionError("no hop")


def test_hops_send_only_the_unseen_suffix_and_returns_run_as_extends(pair):
    a, b = pair["a"], pair["b"]
    prompt = [5, 6, 7, 8]
    a.handle(m.NewRequest("r", prompt, SPEC, n_active=1))
    hop = run_until_hop(a)
    assert a.engine.calls[0] == ("r", prompt)  # prefill, then decodes of one token
    assert all(len(new) == 1 for _, new in a.engine.calls[1:])
    full = list(a.reqs["r"].tokens)
    assert (hop.start, hop.tokens) == (0, full) and hop.origin == "a"  # first visit: everything
    assert a.reqs["r"].status.value == "pending" and not a.runnable
    a_fed = a.reqs["r"].fed
    b.handle(hop)
    back = run_until_hop(b)
    assert back.start == len(full)  # a has seen everything up to its hop
    written_by_b = list(back.tokens)
    assert b.reqs["r"].tokens == full + written_by_b
    a.handle(back)
    n_calls = len(a.engine.calls)
    hop2 = run_until_hop(a)
    assert a.engine.calls[n_calls] == ("r", (full + written_by_b)[a_fed:])  # extend: only unseen tokens
    assert len(a.engine.calls[n_calls][1]) == len(written_by_b) + 1  # + a's own last token
    assert hop2.start == len(full) + len(written_by_b)  # b's last known length
    assert hop2.tokens == a.reqs["r"].tokens[hop2.start :]
    b_fed, n_calls = b.reqs["r"].fed, len(b.engine.calls)
    b.handle(hop2)
    b.step()
    assert b.engine.calls[n_calls] == ("r", (full + written_by_b + hop2.tokens)[b_fed:])
    for s in (a, b):
        s.handle(m.Release("r"))
        assert s.reqs == {} and s.engine.seq_len("r") == 0


def test_the_steps_that_run_a_requests_first_tokens_are_counted(pair):
    """A prefill at the entry model, the whole sequence on a first hop, but not the extend of a return: the
    steps that ran some request's first tokens here, by shape, with the rows that were such first runs
    (`tokenrouter_first_*_by_shape_total`: the throughput model prices them apart)."""
    from tokenrouter.runtime.frontend.metrics import Metrics

    a, b = pair["a"], pair["b"]
    for rid, prompt in (("r", [5, 6, 7]), ("s", [8, 9])):
        a.handle(m.NewRequest(rid, prompt, SPEC, n_active=2))
    hop = run_until_hop(a)
    # one step ran both prompts: 3 tokens, q 4
    assert a.stats().tables.first_by_shape.keys() == {"2/4/untracked"}
    steps, ms, rows = a.stats().tables.first_by_shape["2/4/untracked"]
    assert (steps, rows) == (1, 2) and ms == pytest.approx(a.stats().tables.by_shape["2/4/untracked"][1])
    b.handle(hop)
    back = run_until_hop(b)
    (key, (steps, _, rows)), *_ = b.stats().tables.first_by_shape.items()
    assert len(b.stats().tables.first_by_shape) == 1 and (steps, rows) == (1, 1)
    assert key == f"1/{1 << (len(hop.tokens) - 1).bit_length()}/untracked"  # the whole sequence
    a.handle(back)
    before = a.stats().tables.first_by_shape
    run_until_hop(a)  # the return runs as an extend: no first run
    assert a.stats().tables.first_by_shape == before
    metrics = Metrics(models=["a", "b"])
    metrics.on_stats(a.stats())
    out = metrics.render(active=0)
    assert 'tokenrouter_first_steps_by_shape_total{model="a",bs="2",q="4",overlap="untracked"} 1\n' in out
    assert 'tokenrouter_first_step_rows_by_shape_total{model="a",bs="2",q="4",overlap="untracked"} 2\n' in out


def _serve_alone(plan, engine, prompts, max_tokens=8) -> tuple[Scheduler, dict[str, list[int]]]:
    """Requests at one model (`solo`), stepped until they all end: the scheduler and each one's tokens."""
    a = Scheduler("a", plan, SpyEngine(engine), RouteKernel(plan, "a", "torch", "cpu"),
                  batching=BatchingConfig({"a": 1}, 0.0))  # fmt: skip
    spec = m.SamplingSpec(seed=7, max_tokens=max_tokens, ignore_eos=True)
    for rid, prompt in prompts.items():
        a.handle(m.NewRequest(rid, prompt, spec, n_active=len(prompts)))
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    ended: set[str] = set()
    for _ in range(200):
        for _, msg in a.step():
            if isinstance(msg, m.StepOutputs):
                for t in msg.tokens:
                    tokens[t.rid] += t.token_ids
                ended |= {f.rid for f in msg.finished}
        if ended == set(prompts):
            return a, tokens
    raise AssertionError(f"not all ended: {ended}")


def test_a_step_holds_the_rows_the_kv_pool_can_and_the_rest_wait(tmp_path):
    """Three requests of 24 + 8 tokens against a pool of 64 slots: two fit, the third waits for one to end
    (`kv_deferred_rows`) instead of the engine evicting rows of the step to run the others, and those the next
    step the other way round (an audit's 50 prompts of 1,000 tokens against 43,689 slots took 156 s so, 34 s
    now). Nothing is re-run, and each request writes what it writes with a pool that holds them all."""
    from tokenrouter.runtime.frontend.metrics import Metrics

    plan = compile_policy(tmp_path, "solo")
    prompts = {f"r{i}": [10 + i] * 24 for i in range(3)}
    tight, got = _serve_alone(
        plan, load_engine(plan["models"]["a"]["path"], max_tokens=64, max_len=64), prompts
    )
    roomy, want = _serve_alone(plan, load_engine(plan["models"]["a"]["path"]), prompts)
    assert got == want and all(len(t) == 8 for t in got.values())
    stats = tight.stats()
    assert stats.kv.evictions == 0 and stats.kv.reprefills == 0
    assert stats.kv.deferred_rows > 0 and roomy.stats().kv.deferred_rows == 0
    assert max(int(k.split("/")[0]) for k in stats.tables.by_shape) == 2  # never a step of all three
    metrics = Metrics(models=["a"])
    metrics.on_stats(stats)
    out = metrics.render(active=0)
    assert f'tokenrouter_kv_deferred_rows_total{{model="a"}} {stats.kv.deferred_rows}\n' in out
    assert 'tokenrouter_kv_reprefills_total{model="a"} 0\n' in out


def test_late_hop_of_an_aborted_request_is_dropped(pair):
    a, b = pair["a"], pair["b"]
    a.handle(m.NewRequest("r", [3, 4], SPEC, n_active=1))
    hop = run_until_hop(a)
    for s in (a, b):
        s.handle(m.Abort("r"))
    assert b.handle(hop) == [] and b.reqs == {} and not b.ready()
    assert a.engine.seq_len("r") == 0 and b.engine.seq_len("r") == 0


def test_bad_requests_fail_with_a_message(tmp_path):
    plan = compile_policy(tmp_path, "solo")
    eng = SpyEngine(load_engine(plan["models"]["a"]["path"], max_len=8), fail_rid="bad")
    s = Scheduler("a", plan, eng, RouteKernel(plan, "a", "torch", "cpu"))
    ((dest, out),) = s.handle(m.NewRequest("long", list(range(2, 12)), SPEC, n_active=1))
    assert dest == FRONTEND and out.finished[0].reason == "error" and "at most 7" in out.finished[0].error
    ((_, out),) = s.handle(m.NewRequest("empty", [], SPEC, n_active=1))
    assert "empty" in out.finished[0].error
    s.handle(m.NewRequest("bad", [2, 3], SPEC, n_active=2))
    s.handle(m.NewRequest("good", [2, 3], SPEC, n_active=2))
    outs = [msg for _, msg in s.step()]
    finished = {f.rid: f for o in outs for f in o.finished}
    assert finished["bad"].reason == "error" and "does not fit" in finished["bad"].error
    assert [t.rid for o in outs for t in o.tokens] == ["good"]  # the other row still ran
    for _ in range(10):
        outs += [msg for _, msg in s.step()]
    tokens = [t for o in outs for t in o.tokens]
    assert [t.index for t in tokens] == list(range(6))  # the context end (8) after 6 tokens
    assert {f.rid: f.reason for o in outs for f in o.finished} == {"bad": "error", "good": "length"}
    assert s.reqs == {} and all_free([eng])


@pytest.mark.parametrize("bad", [{"top_k": 2**31}, {"top_k": 2**63 - 1}, {"temperature": 1e300}])
def test_a_request_whose_route_state_cannot_be_packed_fails_alone(tmp_path, bad):
    """Values beyond the route kernel's columns (a client the frontend did not check, a peer's hop) fail
    that request with an error to the frontend; the process and the batch's other rows go on."""
    plan = compile_policy(tmp_path, "solo")
    eng = SpyEngine(load_engine(plan["models"]["a"]["path"]))
    s = Scheduler("a", plan, eng, RouteKernel(plan, "a", "torch", "cpu"))
    sampled = m.SamplingSpec(seed=3, temperature=1.0, top_k=5, max_tokens=3, ignore_eos=True)
    s.handle(m.NewRequest("good", [2, 3], sampled, n_active=2))
    s.handle(
        m.NewRequest("bad", [2, 3], m.SamplingSpec(**{**msgspec.structs.asdict(sampled), **bad}), n_active=2)
    )
    outs = [msg for _, msg in s.step()]
    finished = {f.rid: f for o in outs for f in o.finished}
    assert finished["bad"].reason == "error" and "out of its column's range" in finished["bad"].error
    assert [t.rid for o in outs for t in o.tokens] == ["good"]
    while s.reqs:
        outs += [msg for _, msg in s.step()]
    assert [t.index for o in outs for t in o.tokens] == [0, 1, 2]
    s.handle(
        m.NewRequest(
            "alone", [2, 3], m.SamplingSpec(**{**msgspec.structs.asdict(sampled), **bad}), n_active=1
        )
    )
    ((_, out),) = s.step()
    assert out.finished[0].rid == "alone" and out.finished[0].reason == "error"
    assert s.reqs == {} and all_free([eng])


def test_unknown_model_and_message():
    with pytest.raises(ValueError, match="not in the plan"):
        Scheduler("zz", {"models": {"a": {}}, "routes": {}}, None, None)


def test_step_accounting_is_exact(pair):
    """stats() carries exact totals: steps by batch size, rows, and the tokens the engine actually ran."""
    from tokenrouter.runtime.frontend.metrics import Metrics

    a = pair["a"]
    for i, prompt in enumerate(([5, 6, 7], [8, 9], [10, 11, 12, 13])):
        a.handle(m.NewRequest(f"r{i}", prompt, SPEC, n_active=3))
    for _ in range(6):
        a.step()
    s = a.stats()
    assert s.step.count == sum(n for n, _, _ in s.tables.by_bs.values()) > 0
    assert s.step.rows == sum(bs * n for bs, (n, _, _) in s.tables.by_bs.items())
    assert s.step.rows == sum(1 for _ in a.engine.calls)  # one engine row per request per step
    assert s.step.new_tokens == sum(len(new) for _, new in a.engine.calls)
    assert s.step.busy_ms == pytest.approx(sum(ms for _, ms, _ in s.tables.by_bs.values()))
    metrics = Metrics(models=["a", "b"])
    metrics.on_stats(s)
    out = metrics.render(active=0)
    assert f'tokenrouter_step_tokens_total{{model="a"}} {s.step.new_tokens}' in out
    assert f'tokenrouter_steps_by_batch_total{{model="a",bs="3"}} {s.tables.by_bs[3][0]}' in out
    # the tokens by batch size: the 3-row prefill's 9, then one per decode row
    assert s.tables.by_bs[3][2] == 9 + 3 * (s.tables.by_bs[3][0] - 1)
    assert sum(k for _, _, k in s.tables.by_bs.values()) == s.step.new_tokens
    assert f'tokenrouter_step_tokens_by_batch_total{{model="a",bs="3"}} {s.tables.by_bs[3][2]}' in out
    # each step after the first followed the one before back to back
    assert s.step.gaps == s.step.count - 1 == 2
    assert 'tokenrouter_step_gaps_total{model="a"} 2' in out
    assert f'tokenrouter_step_gap_seconds_total{{model="a"}} {s.step.gap_ms / 1000.0}' in out


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")])],
)  # fmt: skip
def test_tokens_and_rules_reach_the_host_unchanged(device):
    """On CUDA both come back with one copy (concatenated as int64): every token id and rule index intact."""
    token = torch.tensor([0, 151_935, 2**40 + 3, 5], dtype=torch.int64, device=device)
    rule = torch.tensor([-1, 0, 3, -1], dtype=torch.int32, device=device)
    tokens, rules = Scheduler._tokens_and_rules(RouteResult(token, token.float(), rule))
    assert (tokens, rules) == ([0, 151_935, 2**40 + 3, 5], [-1, 0, 3, -1])
    assert all(type(x) is int for x in tokens + rules)


def test_q_class_is_the_longest_rows_new_tokens_rounded_up_to_a_power_of_two():
    from tokenrouter.runtime.subserver.recorder import q_class

    assert [q_class(q) for q in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 65, 512)] == [
        1, 2, 4, 4, 8, 8, 16, 16, 32, 64, 128, 512
    ]  # fmt: skip


def test_a_stalled_step_is_counted_apart_and_logged(tmp_path, monkeypatch, caplog):
    """A step over 10x its batch size's mean (and over 50 ms) is a stall: counted in tables.slow_by_bs as well
    as in the totals, shown in /metrics and logged with its shape; a step before 20 of its batch size is
    never one, nor one under the floor."""
    from tokenrouter.runtime.frontend.metrics import Metrics
    from tokenrouter.runtime.subserver import recorder as sched_mod

    stall = sched_mod.is_stall
    none = (0, 0.0, 0)
    assert not stall(1000.0, 1, (19, 19 * 5.0, 19), none)  # too little history
    assert stall(1000.0, 1, (19, 19 * 5.0, 19), (40, 40 * 5.0, 40))  # ... of this batch size: all steps judge
    assert not stall(45.0, 1, (100, 100 * 1.0, 100), none)  # under the floor
    assert not stall(60.0, 1, (100, 100 * 7.0, 100), none)  # under 10x the mean
    assert stall(80.0, 1, (100, 100 * 7.0, 100), none)
    assert stall(80.0, 12, (100, 100 * 7.0, 1200), none)  # as many tokens as usual
    assert not stall(800.0, 4096, (100, 100 * 7.0, 1200), none)  # a long prefill: 341x the tokens
    plan = compile_policy(tmp_path, "solo")  # one model: the request stays, one row per step
    engine = SpyEngine(load_engine(plan["models"]["a"]["path"]))
    a = Scheduler(
        "a", plan, engine, RouteKernel(plan, "a", "torch", "cpu"), batching=BatchingConfig({"a": 1}, 0.0)
    )
    durations = iter([5.0] * 24 + [900.0] + [5.0] * 5)  # ms per step: the 25th stalls
    now = [0.0]

    def clock() -> float:  # step() reads it twice per step: before and after the batch
        return now[0]

    monkeypatch.setattr(sched_mod.time, "perf_counter", clock)
    real_run = a.run_batch

    def timed_run(batch):
        out = real_run(batch)
        ms = next(durations)
        if ms > 100:  # the stalled step builds a Triton kernel (kernel_loads.py's hooks call these)
            a.recorder.kernel_loads.started()
        now[0] += ms / 1000.0
        if ms > 100:
            a.recorder.kernel_loads.ended("_paged_attention_kernel")
        return out

    monkeypatch.setattr(a, "run_batch", timed_run)
    a.handle(m.NewRequest("r0", [5, 6, 7], SPEC, n_active=1))
    with caplog.at_level("WARNING", logger=sched_mod.__name__):
        for _ in range(30):
            a.step()
    s = a.stats()
    assert s.tables.by_bs[1] == (30, pytest.approx(29 * 5.0 + 900.0), 3 + 29)
    assert s.tables.slow_by_bs == {1: (1, pytest.approx(900.0))}
    assert (
        "a: step 25 stalled: 900 ms at batch size 1 (1 new tokens; the earlier steps make it expect 5.0 ms; "
        "1 Triton kernel build in it, 900 ms (_paged_attention_kernel))" in caplog.text
    )
    assert s.kernels.count == 1 and s.kernels.ms == pytest.approx(900.0)
    # by shape: the 3-token prefill (q rounded up to 4), the decodes, the stall apart; no busy board: untracked
    assert s.tables.by_shape == {
        "1/4/untracked": (1, pytest.approx(5.0), 3),
        "1/1/untracked": (28, pytest.approx(28 * 5.0), 28),
        "1/1/stall": (1, pytest.approx(900.0), 1),
    }
    metrics = Metrics(models=["a", "b"])
    metrics.on_stats(s)
    out = metrics.render(active=0)
    assert 'tokenrouter_kernel_loads_total{model="a"} 1' in out
    assert 'tokenrouter_kernel_load_seconds_total{model="a"} 0.9' in out
    assert 'tokenrouter_slow_steps_by_batch_total{model="a",bs="1"} 1' in out
    assert 'tokenrouter_slow_step_seconds_by_batch_total{model="a",bs="1"} 0.9' in out


def test_steps_count_why_they_started(tmp_path):
    """`stats().step_starts` (`tokenrouter_step_starts_total`): each step counted once, by the threshold it
    reached as configured, as lowered for few active requests, because every request the subserver holds was
    runnable, or by the max_delay timeout. The policy hands every token over: a step sends its rows away."""
    plan = compile_policy(tmp_path, "relay")
    now = [0.0]
    a, b = (Scheduler(x, plan, SpyEngine(load_engine(plan["models"][x]["path"])),
                      RouteKernel(plan, x, "torch", "cpu"), batching=BatchingConfig({"a": 3, "b": 1}, 5.0),
                      clock=lambda: now[0]) for x in "ab")  # fmt: skip
    spec = m.SamplingSpec(seed=7, max_tokens=50, ignore_eos=True)

    def hops(out) -> list[m.PeerRequest]:
        return [msg for _, msg in out if isinstance(msg, m.PeerRequest)]

    for i in range(3):
        a.handle(m.NewRequest(f"t{i}", [5, 6, 7], spec, n_active=10, count_seq=1))  # hops carry the count
    assert a.ready()
    away = hops(a.step())  # three runnable, B = 3: all three hop to b and stay held by a (pending)
    assert len(away) == 3 and len(a.reqs) == 3 and not a.runnable
    b.handle(away[0])
    a.handle(hops(b.step())[0])  # t0 back: one runnable of three held
    assert not a.ready()
    now[0] += 0.005
    assert a.ready()
    b.handle(hops(a.step())[0])  # the oldest waited 5 ms; t0 hops again
    for rid in ("t1", "t2"):  # ended elsewhere
        a.handle(m.Release(rid))
    a.handle(hops(b.step())[0])  # t0 back: the one request a holds is runnable, nothing else can join
    assert a.ready()
    b.handle(hops(a.step())[0])
    a.handle(m.NewRequest("alone", [5, 6], spec, n_active=1, count_seq=2))  # B lowered to 1 (t0 held, away)
    assert a.ready() and a.step()
    assert a.stats().step.starts == {"threshold": 1, "timeout": 1, "held": 1, "lowered": 1}
    assert a.recorder.steps == 4


def test_steps_no_co_runner_step_overlapped_are_counted_alone(tmp_path):
    """With a busy board (models sharing a GPU), a step that no co-runner's step overlapped counts in
    `tables.alone_by_bs` (`tokenrouter_alone_steps_by_batch_total`) as well as in `tables.by_bs`. Not alone: a
    co-runner in a step when it starts, or one that starts (and perhaps ends) a step during it, as a model
    between back-to-back steps or woken by a hop does. The model's own count is odd for the length of the
    step, and even after, also when the step fails."""
    plan = compile_policy(tmp_path, "keep")
    board = create_board(tmp_path / "board", 2)
    a = Scheduler("a", plan, SpyEngine(load_engine(plan["models"]["a"]["path"])),
                  RouteKernel(plan, "a", "torch", "cpu"), batching=BatchingConfig({"a": 1, "b": 1}, 5.0))  # fmt: skip
    a.recorder.board = BusyBoard(board, 0, (1,))
    other = BusyBoard(board, 1, (0,))  # model b's view
    seen = []
    real_forward = a._forward
    during = None  # what b does while a's step runs

    def a_in_step() -> bool:  # a's count in the board file, as every subserver reads it: odd in a step
        return bool(int.from_bytes(board.read_bytes()[:4], "little") & 1)

    def forward(batch):
        seen.append(a_in_step())
        if during is not None:
            during()
        return real_forward(batch)

    a._forward = forward
    spec = m.SamplingSpec(seed=7, max_tokens=1, ignore_eos=True)

    def b_steps():  # b starts and ends a whole step inside a's
        other.end(other.start())

    cases = [  # (b in a step when a's starts, what b does during a's step, alone?)
        (False, None, True),
        (True, None, False),
        (False, other.start, False),  # b starts during a's step, still in it at a's end
        (False, b_steps, False),
        (False, None, True),
    ]
    for i, (b_busy, b_during, _) in enumerate(cases):
        if b_busy and not other.busy():
            other.start()
        if not b_busy and other.busy():
            other.end(None)
        during = b_during
        a.handle(m.NewRequest(f"r{i}", [5, 6, 7], spec, n_active=1))
        a.step()
    other.end(None)
    assert a.recorder.steps == len(cases)
    assert seen == [True] * len(cases) and not a_in_step()
    st = a.stats()
    assert sum(n for n, _, _ in st.tables.by_bs.values()) == len(cases)
    alone = st.tables.alone_by_bs
    assert list(alone) == [1] and alone[1][0] == sum(c[2] for c in cases) == 2
    assert 0 < alone[1][1] < st.tables.by_bs[1][1]
    assert st.tables.by_bs[1][2] == 3 * len(cases) and alone[1][2] == 3 * 2  # 3-token prefills
    from tokenrouter.runtime.frontend.metrics import Metrics

    metrics = Metrics(models=["a", "b"])
    metrics.on_stats(st)
    text = metrics.render(active=0)
    assert 'tokenrouter_alone_step_tokens_by_batch_total{model="a",bs="1"} 6\n' in text
    # by shape: 3-token prefills (q rounded up to 4), alone twice, overlapped three times
    assert {k: v[0] for k, v in st.tables.by_shape.items()} == {"1/4/alone": 2, "1/4/overlapped": 3}
    assert st.tables.by_shape["1/4/alone"][1] == pytest.approx(alone[1][1])
    assert 'tokenrouter_steps_by_shape_total{model="a",bs="1",q="4",overlap="overlapped"} 3\n' in text
    assert 'tokenrouter_step_tokens_by_shape_total{model="a",bs="1",q="4",overlap="alone"} 6\n' in text

    def broken(batch):
        raise RuntimeError("the device went away")

    a._forward = broken
    a.handle(m.NewRequest("s", [5, 6], spec, n_active=1))
    with pytest.raises(RuntimeError):
        a.step()
    assert not a_in_step()  # the count is even again
    a.recorder.board.close()
    other.close()
    with pytest.raises(ValueError, match="outside its 2 models"):
        BusyBoard(board, 2, (0,))


def test_host_time_between_back_to_back_steps(tmp_path):
    """A step that ends with the next one ready to start leaves its end time; the next step counts the host
    time since then (`gaps`, `gap_ms`: `tokenrouter_step_gap_seconds_total`). A step that starts after the
    subserver had nothing to run counts none."""
    plan = compile_policy(tmp_path, "keep")
    a = Scheduler("a", plan, SpyEngine(load_engine(plan["models"]["a"]["path"])),
                  RouteKernel(plan, "a", "torch", "cpu"), batching=BatchingConfig({"a": 1, "b": 1}, 5.0))  # fmt: skip
    spec = m.SamplingSpec(seed=7, max_tokens=8, ignore_eos=True)
    a.handle(m.NewRequest("r", [5, 6, 7], spec, n_active=1))
    a.step()  # the prefill: the request stays runnable, so the next step could start at once
    assert a.recorder.gaps == 0
    time.sleep(0.02)  # host work between the two steps
    assert any(isinstance(msg, m.PeerRequest) for _, msg in a.step())  # the policy hops: nothing is ready
    assert a.recorder.gaps == 1 and 15.0 < a.recorder.gap_ms < 1000.0
    a.handle(m.NewRequest("s", [5, 6], spec, n_active=1))
    time.sleep(0.02)
    a.step()  # after an idle subserver: no gap
    assert a.recorder.gaps == 1 and a.recorder.steps == 3
    st = a.stats()
    assert (st.step.gaps, st.step.gap_ms) == (1, a.recorder.gap_ms)


def test_a_hops_delay_counts_from_its_send_or_from_the_end_of_the_step_it_arrived_during(pair):
    """A hop carries the end time of the step that sent it (`sent_at`, on time.monotonic()); the receiver counts
    its delay until the scheduler takes it in (`hops_in`, `hop_delay_ms`: `tokenrouter_hop_delay_seconds_total`).
    Sent while the receiver was in a step, the hop could only join the next step anyway: its delay counts from
    that step's end. A step the receiver started after the send ran without the hop, and counts."""
    from tokenrouter.runtime.frontend.metrics import Metrics

    a, b = pair["a"], pair["b"]
    a.handle(m.NewRequest("r", [5, 6, 7, 8], SPEC, n_active=2))
    b.handle(m.NewRequest("s", [5, 6], SPEC, n_active=2))
    before = time.monotonic()
    hop = run_until_hop(a)
    assert before < hop.sent_at <= time.monotonic()  # the end of a's step
    time.sleep(0.02)
    b.handle(hop)  # b was idle: the whole time since the send counts
    assert b.recorder.hops_in == 1 and 15.0 < b.recorder.hop_delay_ms < 1000.0
    back = run_until_hop(b)  # b now runs r and s
    # sent during one of a's steps that is still recent (a pretends to have been in a step ending 10 ms from
    # now): only the time since that step's end counts, which is none yet
    a.recorder._recent_steps.append((back.sent_at - 0.001, time.monotonic() + 0.01))
    a.handle(back)
    assert a.recorder.hops_in == 1 and a.recorder.hop_delay_ms == 0.0
    a.step()  # r runs again on a; its next hop goes out while b starts a step without it
    hop = run_until_hop(a)
    b.step()  # s still runs on b
    began, ended = b.recorder._recent_steps[-1]
    assert began > hop.sent_at  # a step that ran without the hop
    time.sleep(0.01)
    delay = b.recorder.hop_delay_ms
    b.handle(hop)  # the step b ran after the send counts, and the 10 ms since
    rec = b.recorder
    assert rec.hops_in == 2 and rec.hop_delay_ms - delay >= (ended - hop.sent_at) * 1000.0 + 10.0
    st = b.stats()
    assert (st.hops.received, st.hops.delay_ms) == (2, b.recorder.hop_delay_ms)
    metrics = Metrics(models=["a", "b"])
    metrics.on_stats(st)
    out = metrics.render(active=0)
    assert 'tokenrouter_hops_in_total{model="b"} 2' in out
    assert f'tokenrouter_hop_delay_seconds_total{{model="b"}} {st.hops.delay_ms / 1000.0}' in out
    unstamped = m.PeerRequest("t", "a", 0, [5, 6], 2, 0, SPEC)  # a sender without the stamp: not counted
    b.handle(unstamped)
    assert b.recorder.hops_in == 2


def test_a_hop_cannot_bring_back_an_older_count(tmp_path):
    """The large model's threshold follows the newest count n it has heard of: a hop that carries its
    sender's older, lower count (sent before the latest arrivals reached the sender) does not lower it, a hop
    with a newer count does. Before counts were numbered a hop's lower count was always taken: with 8 requests
    active the 8B's B = 5 fell to 1 until n changed again (219 of 333 steps on the CPU)."""
    plan = compile_policy(tmp_path, "keep")
    b = Scheduler("b", plan, SpyEngine(load_engine(plan["models"]["b"]["path"])),
                  RouteKernel(plan, "b", "torch", "cpu"), batching=BatchingConfig({"a": 1, "b": 5}, 5.0))  # fmt: skip
    b.handle(m.ActiveCount(n_active=8, count_seq=8))
    assert b.batching.threshold == 5

    def hop(rid: str, n: int, seq: int) -> m.PeerRequest:
        return m.PeerRequest(rid=rid, origin="a", start=0, tokens=[5, 6, 7], prompt_len=2, generated=1,
                             sampling=SPEC, n_active=n, count_seq=seq)  # fmt: skip

    b.handle(hop("old", 1, 1))  # sent by a when it had heard of one request only
    assert (b.batching.n_active, b.batching.threshold) == (8, 5)
    assert not b.batching.should_run(1, 0.0, 0.0)  # by the count (b.ready(): the one request b holds runs)
    b.handle(hop("new", 4, 9))  # a heard of a finish b has not heard of yet: taken
    assert (b.batching.n_active, b.batching.threshold, b.batching.count_seq) == (4, 4, 9)
    b.handle(m.ActiveCount(n_active=8, count_seq=8))  # the frontend's older message, arriving late
    assert b.batching.n_active == 4
    b.handle(hop("bare", 2, 0))  # unnumbered (an older peer): only ever lowers
    assert b.batching.threshold == 2 and b.ready()
