import pytest

from tokenrouter.compiler.passes.check_feasibility import feasibility_error
from tokenrouter.throughput.dtmc import ChainError, analyze
from tokenrouter.throughput.inputs import StepLatency, make_inputs
from tokenrouter.throughput.optimize import TuneError, candidates, tune
from tokenrouter.throughput.simulate import SimConfig, simulate


def r2r(n: int, p: float = 0.35):
    return make_inputs(["slm", "llm"], {"slm": 6.0, "llm": 27.9}, [[1 - p, p], [1, 0]], [[1, 0], [1, 0]], n)


@pytest.mark.parametrize(("n", "expected"), [(2, 2), (3, 2), (4, 3)])
def test_paper_validation(n, expected):
    result = tune(r2r(n), fixed={"slm": 1}, delta_ms=0.1)
    assert result.method == "exhaustive"
    assert result.best_thresholds() == {"slm": 1, "llm": expected}
    assert len(result.results) == n  # B_llm in 1..N, all feasible with B_slm = 1


def test_single_model_is_exact():
    # one model, B = 1: a batch of all N every L ms, each request commits c tokens per step
    inp = make_inputs(["a"], {"a": 5.0}, [[1.0]], [[1.0]], 7)
    r = analyze(inp, (1,))
    assert r.throughput == pytest.approx(7 / 5.0 * 1000)
    assert r.utilization == pytest.approx((1.0,))
    assert r.mean_batch == pytest.approx((7.0,))


def test_batch_dependent_latency_changes_throughput():
    flat = r2r(4)
    steep = make_inputs(
        ["slm", "llm"],
        {"slm": 6.0, "llm": StepLatency(((1, 27.9), (4, 40.0)))},
        [[0.65, 0.35], [1, 0]],
        [[1, 0], [1, 0]],
        4,
    )
    assert analyze(steep, (1, 2)).throughput < analyze(flat, (1, 2)).throughput


GRID = [
    # (latencies, p, c, N, B)
    ({"a": 6.0, "b": 27.9}, [[0.65, 0.35], [1, 0]], [[1, 0], [1, 0]], 3, (1, 2)),
    ({"a": 6.0, "b": 27.9}, [[0.65, 0.35], [1, 0]], [[1, 0], [1, 0]], 6, (2, 3)),
    ({"a": 2.0, "b": 9.0}, [[0.9, 0.1], [0.5, 0.5]], [[1, 1], [1, 1]], 5, (1, 1)),
    ({"a": 2.0, "b": StepLatency(((1, 9.0), (5, 14.0)))}, [[0.8, 0.2], [1, 0]], [[1, 0], [1, 0]], 5, (1, 3)),
    (
        {"a": 3.0, "b": 5.0, "c": 11.0},
        [[0.8, 0.15, 0.05], [0.7, 0.3, 0], [1, 0, 0]],
        [[1, 1, 0], [1, 1, 0], [1, 0, 0]],
        4,
        (1, 2, 2),
    ),  # fmt: skip
]


@pytest.mark.parametrize("case", GRID)
def test_chain_and_simulator_agree(case):
    lat, p, c, n, b = case
    inp = make_inputs(list(lat), lat, p, c, n)
    chain = analyze(inp, b).throughput
    sim = simulate(inp, SimConfig(b, horizon_ms=40_000, seed=1)).throughput
    assert sim == pytest.approx(chain, rel=0.03)


def test_simulator_detects_a_different_policy():
    # negative control: the 3% agreement is not automatic
    inp = r2r(4)
    assert simulate(inp, SimConfig((1, 1), horizon_ms=20_000)).throughput != pytest.approx(
        analyze(inp, (1, 3)).throughput, rel=0.03
    )


def test_infeasible_fixed_thresholds_refused_with_check_message():
    with pytest.raises(TuneError) as exc:
        tune(r2r(4), fixed={"slm": 3, "llm": 3})
    assert str(exc.value) == feasibility_error({"slm": 3, "llm": 3}, 4)


def test_deadlocking_thresholds_raise():
    with pytest.raises(ChainError, match="deadlock"):
        analyze(r2r(3), (2, 3))  # Σ(B−1) = 3 is not < 3


def test_candidates_respect_feasibility_and_fixed():
    cands = candidates(3, 4, {0: 1})
    assert all(b[0] == 1 and sum(x - 1 for x in b) < 4 for b in cands)
    assert len(cands) == 10  # (x, y) >= 0 with x + y <= 3


def test_sampled_search_when_the_set_is_large():
    """More candidates than the exhaustive limit: the chains are sampled (`large_n.py`, tests/throughput/
    test_large_n.py), and the choice is within 3 % of the exhaustive one by the chain."""
    result = tune(r2r(6), exhaustive_limit=5)
    assert result.method == "sampled"
    exhaustive = tune(r2r(6))
    chain = {r.thresholds: r.throughput for r in exhaustive.results}
    assert chain[result.best.thresholds] >= 0.97 * exhaustive.best.throughput


def test_vectorized_chain_equals_reference():
    inp = make_inputs(["a", "b", "c"], {"a": 3.0, "b": 5.0, "c": 11.0},
                      [[0.8, 0.15, 0.05], [0.7, 0.3, 0], [1, 0, 0]], [[1, 1, 0], [1, 1, 0], [1, 0, 0]], 5)  # fmt: skip
    assert_same_chain(inp, (1, 2, 2), 1.0)


def assert_same_chain(inp, thresholds, delta_ms) -> None:
    """The vectorized builder's chain is the reference loop's, up to the order of the states."""
    import numpy as np

    from tokenrouter.throughput.dtmc import build_chain

    ref = build_chain(inp, thresholds, delta_ms, reference=True)
    fast = build_chain(inp, thresholds, delta_ms)
    pos = {tuple(s): i for i, s in enumerate(fast[0].tolist())}
    perm = np.array([pos[tuple(s)] for s in ref[0].tolist()])
    assert len(perm) == fast[0].shape[0]
    assert np.allclose(ref[1].toarray(), fast[1].toarray()[np.ix_(perm, perm)])
    assert np.allclose(ref[2], fast[2][perm]) and np.allclose(ref[3], fast[3][perm])


def test_power_iteration_matches_direct_solve():
    import numpy as np

    from tokenrouter.throughput.dtmc import _stationary_irreducible, build_chain

    _, mat, *_ = build_chain(r2r(6), (1, 2), 0.1)
    direct = _stationary_irreducible(mat, direct_limit=10**9)
    power = _stationary_irreducible(mat, direct_limit=0)
    assert np.abs(direct - power).sum() < 1e-8


def test_stationary_weights_several_closed_classes_by_absorption():
    import numpy as np
    import scipy.sparse as sp

    from tokenrouter.throughput.dtmc import stationary

    # 0 -> {1 (absorbing), 2}; 2 <-> 3 a periodic class
    mat = sp.csr_matrix(np.array([[0, 0.25, 0.75, 0], [0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]], dtype=float))
    assert stationary(mat) == pytest.approx([0, 0.25, 0.375, 0.375])


@pytest.mark.parametrize(
    ("lat", "p", "n", "b", "delta"),
    [
        ({"slm": 6.0, "llm": 27.9}, [[0.65, 0.35], [1, 0]], 6, (1, 2), 0.1),
        ({"slm": 6.0, "llm": 27.9}, [[0.65, 0.35], [1, 0]], 8, (2, 3), 0.5),
        ({"a": 6.0, "b": 12.3, "c": 27.9}, [[0.6, 0.3, 0.1]] * 3, 5, (1, 2, 2), 1.0),
        ({"a": 3.0, "b": 5.0, "c": 11.0}, [[0.8, 0.15, 0.05], [0.7, 0.3, 0], [1, 0, 0]], 5, (1, 1, 2), 1.0),
    ],
)
def test_iterative_solve_gives_the_direct_throughput(lat, p, n, b, delta):
    # the Gauss-Seidel path (used above 4,000 states) against sparse LU: same T(B) within 1e-9 relative
    import numpy as np

    from tokenrouter.throughput.dtmc import _stationary_irreducible, build_chain

    m = len(lat)
    _, mat, reward, tau, _ = build_chain(make_inputs(list(lat), lat, p, np.ones((m, m)), n), b, delta)
    direct = _stationary_irreducible(mat, direct_limit=10**9)
    fast = _stationary_irreducible(mat, direct_limit=0)
    t_direct, t_fast = (direct @ reward) / (direct @ tau), (fast @ reward) / (fast @ tau)
    assert abs(t_fast - t_direct) <= 1e-9 * t_direct


def test_finite_run_of_unlike_requests_is_exact_when_routing_is_certain():
    """`SimConfig.requests`: one request at a time (N = 1), 10 tokens each; the first never leaves the fast
    entry model (10 steps of 1 ms), the second bounces on every token (a dropped entry step of 1 ms, then a
    10 ms step of the other model that commits the token): 10 + 110 ms for 20 tokens."""
    inp = make_inputs(
        ["fast", "slow"], {"fast": 1.0, "slow": 10.0}, [[0.9, 0.1], [1, 0]], [[1, 0], [1, 0]], 1
    )
    stay, bounce = [[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0]]
    r = simulate(inp, SimConfig((1, 1), request_tokens=10, requests=(stay, bounce)))
    assert r.time_ms == pytest.approx(120.0) and r.tokens == 20 and r.finished_requests == 2
    assert r.throughput == pytest.approx(20 / 120.0 * 1000)
    # two at a time: both start at once and share the fast model's steps; the bouncer ends alone
    r2 = simulate(
        make_inputs(["fast", "slow"], {"fast": 1.0, "slow": 10.0}, [[1, 0], [1, 0]], [[1, 0], [1, 0]], 2),
        SimConfig((1, 1), request_tokens=10, requests=(stay, bounce)),
    )
    assert r2.time_ms == pytest.approx(110.0) and r2.finished_requests == 2


def test_finite_run_requests_of_their_own_lengths_end_when_each_has_its_tokens():
    """`SimConfig.request_lengths`: the same two requests, one at a time, of 10 and 3 tokens (a load whose
    requests asked for different lengths, or ended at EOS): 10 ms, then 3 bounces of 11 ms; bad lengths are
    refused."""
    inp = make_inputs(
        ["fast", "slow"], {"fast": 1.0, "slow": 10.0}, [[0.9, 0.1], [1, 0]], [[1, 0], [1, 0]], 1
    )
    stay, bounce = [[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0]]
    r = simulate(inp, SimConfig((1, 1), request_tokens=10, requests=(stay, bounce), request_lengths=(10, 3)))
    assert r.time_ms == pytest.approx(43.0) and r.tokens == 13 and r.finished_requests == 2
    for bad, msg in (((10,), "one length each"), ((10, 0), "ints >= 1"), ((10, True), "ints >= 1")):
        with pytest.raises(ValueError, match=msg):
            SimConfig((1, 1), request_tokens=10, requests=(stay, bounce), request_lengths=bad)
    with pytest.raises(ValueError, match="needs requests"):
        SimConfig((1, 1), request_tokens=10, request_lengths=(10,))


def test_finite_run_of_alike_requests_approaches_the_steady_state():
    inp = make_inputs(["a", "b"], {"a": 2.0, "b": 9.0}, [[0.9, 0.1], [1, 0]], [[1, 0], [1, 0]], 4)
    p = [[0.9, 0.1], [1.0, 0.0]]
    finite = simulate(inp, SimConfig((1, 1), request_tokens=200, requests=(p,) * 200, seed=3))
    steady = analyze(inp, (1, 1)).throughput
    assert finite.finished_requests == 200 and finite.throughput == pytest.approx(steady, rel=0.05)


def test_a_model_that_one_request_visits_does_not_wait_for_a_partner():
    """`SimConfig.held_rule` (the runtime's): one request bounces on every token, 36 others never leave the
    entry model. At B_slow = 2 the slow model holds only the bouncer, so it steps at once, as at B = 1; without
    the rule each of its ten visits waits for the 20 ms timeout while the others run (120 against 190 ms)."""
    inp = make_inputs(
        ["fast", "slow"], {"fast": 1.0, "slow": 10.0}, [[0.9, 0.1], [1, 0]], [[1, 0], [1, 0]], 4
    )
    stay, bounce = [[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0]]
    cfg = dict(request_tokens=10, requests=(bounce,) + (stay,) * 36, max_delay_ms=20.0)
    eager = simulate(inp, SimConfig((1, 1), **cfg))
    assert eager.time_ms == pytest.approx(120.0) and eager.finished_requests == 37
    for b in ((1, 2), (2, 2)):
        assert simulate(inp, SimConfig(b, **cfg)).time_ms == pytest.approx(eager.time_ms)
        assert simulate(inp, SimConfig(b, held_rule=False, **cfg)).time_ms == pytest.approx(190.0)


def test_a_request_away_longer_than_held_away_ms_is_not_waited_for():
    """`SimConfig.held_away_ms`, a what-if refinement of the held rule (not in the runtime): X bounces between
    fast and slow on every token; Y visits slow once, then writes the rest of its tokens on a third model. The
    runtime's rule keeps Y held at slow until Y ends, so at B_slow = 2 X's visits wait for the 20 ms timeout
    meanwhile; with held_away_ms = 0 slow waits for no request away and steps as at B = 1; with 5 ms it waits
    at most 5 ms after Y left; with an hour, as the runtime does. `held_expect`, the other what-if, likewise."""
    inp = make_inputs(
        ["fast", "slow", "other"],
        {"fast": 1.0, "slow": 10.0, "other": 1.0},
        [[0, 1, 0], [1, 0, 0], [0, 0, 1]],
        [[1, 1, 1], [1, 1, 1], [1, 1, 1]],
        2,
    )
    x = [[0, 1, 0], [1, 0, 0], [1, 0, 0]]
    y = [[0, 1, 0], [0, 0, 1], [0, 0, 1]]
    cfg = dict(request_tokens=40, requests=(x, y), max_delay_ms=20.0)
    eager = simulate(inp, SimConfig((1, 1, 1), **cfg)).time_ms
    held = simulate(inp, SimConfig((1, 2, 1), **cfg)).time_ms
    assert held > eager + 20.0  # at least one visit of X waited for the timeout
    assert simulate(inp, SimConfig((1, 2, 1), held_away_ms=0.0, **cfg)).time_ms == pytest.approx(eager)
    assert simulate(inp, SimConfig((1, 2, 1), held_away_ms=3_600_000.0, **cfg)).time_ms == pytest.approx(held)
    five = simulate(inp, SimConfig((1, 2, 1), held_away_ms=5.0, **cfg)).time_ms
    assert eager < five < held and five == pytest.approx(
        eager + 4.0
    )  # X's second visit waits until Y is 5 ms away
    # `held_expect`: step once Y, which has left slow once since its first step there, is expected back with less
    # than that probability before the timeout: a vast bound is never reached by waiting (eager), a tiny one is
    # only at the timeout (the runtime's rule), one half in between
    rows = {e: simulate(inp, SimConfig((1, 2, 1), held_expect=e, **cfg)).time_ms for e in (1e9, 1e-12, 0.5)}
    assert rows[1e9] == pytest.approx(eager) and rows[1e-12] == pytest.approx(held)
    assert eager < rows[0.5] < held
    with pytest.raises(ValueError, match="held_away_ms must be a finite number >= 0 with held_rule"):
        SimConfig((1, 2, 1), held_rule=False, held_away_ms=5.0)
    with pytest.raises(ValueError, match="held_away_ms"):
        SimConfig((1, 2, 1), held_away_ms=-1.0)
    for kw in (
        {"held_expect": 0.0},
        {"held_expect": 0.5, "held_away_ms": 5.0},
        {"held_expect": 0.5, "held_rule": False},
    ):
        with pytest.raises(ValueError, match="held_expect must be a finite number > 0"):
            SimConfig((1, 2, 1), max_delay_ms=20.0, **kw)
    with pytest.raises(ValueError, match="held_expect"):
        SimConfig((1, 2, 1), held_expect=0.5)  # no timeout: no window to expect rows in


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"requests": ([[1.0, 0.0], [1.0, 0.0]],)}, "needs request_tokens"),
        ({"requests": (), "request_tokens": 4}, "needs request_tokens"),
    ],
)
def test_finite_run_settings_are_checked(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SimConfig((1, 1), **kw)


def test_finite_run_rejects_a_routing_matrix_of_the_wrong_shape():
    inp = r2r(2)
    with pytest.raises(ValueError, match="request 1: routing must be 2x2"):
        simulate(inp, SimConfig((1, 1), request_tokens=4, requests=([[1, 0], [1, 0]], [[1.0]])))


def test_a_hops_transit_delays_the_request_by_exactly_that_long():
    """`SimConfig.hop_ms`: a hop reaches its target that long after the sender's step ends (the chain takes
    hops as instant). One request alternating between two models, each step committing one token: a cycle is
    the two steps plus the two transits, so the throughput is 2 tokens per (2 + 7 + 0.5 + 1.5) ms."""
    inp = make_inputs(["slm", "llm"], {"slm": 2.0, "llm": 7.0}, [[0, 1], [1, 0]], [[1, 1], [1, 1]], 1)
    instant = simulate(inp, SimConfig((1, 1), horizon_ms=10_000.0, warmup_ms=0.0))
    assert instant.throughput == pytest.approx(2 / 9.0 * 1000, rel=1e-3)
    delayed = simulate(inp, SimConfig((1, 1), horizon_ms=10_000.0, warmup_ms=0.0, hop_ms=(0.5, 1.5)))
    assert delayed.throughput == pytest.approx(2 / 11.0 * 1000, rel=1e-3)
    assert delayed.utilization == pytest.approx((2 / 11.0, 7 / 11.0), rel=1e-3)
    with pytest.raises(ValueError, match="hop_ms must be finite numbers >= 0"):
        SimConfig((1, 1), hop_ms=(0.5, -1.0))
    with pytest.raises(ValueError, match="expected 2 hop delays"):
        simulate(inp, SimConfig((1, 1), hop_ms=(0.5,)))
