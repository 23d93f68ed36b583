"""throughput/timeout_check.py: the tokens per request its simulations give requests, and the timeout search's
choice (going from the shortest timeout up, a pair replaces the one held only by more than 1 %)."""

from __future__ import annotations

import dataclasses

from tokenrouter.throughput import timeout_check as tc
from tokenrouter.throughput.inputs import PrefillCost, StepLatency, SystemInputs, make_inputs


def two(n: int = 4) -> SystemInputs:
    return make_inputs(["slm", "llm"], {"slm": StepLatency.constant(6.0), "llm": StepLatency.constant(27.9)},
                       [[0.65, 0.35], [1.0, 0.0]], [[1, 0], [1, 1]], n)  # fmt: skip


def test_requests_commit_the_given_tokens_else_the_loads_own_from_the_entrys_prefill_prices():
    inputs = two()
    assert tc.sim_request_tokens(inputs, 64) == 64
    assert (
        tc.sim_request_tokens(inputs, None) is None
    )  # no prefill priced: requests never end, as the chain's
    priced = dataclasses.replace(inputs, prefill=(PrefillCost(0.04, 8.0), PrefillCost(0.05, 9.0)))
    assert (
        tc.sim_request_tokens(priced, None) == 200
    )  # 8 ms per request's visit / 0.04 ms per committed token
    assert tc.sim_request_tokens(dataclasses.replace(inputs, prefill=(PrefillCost(0.04), None)), None) is None


def test_the_search_keeps_a_longer_timeout_only_where_it_serves_more_than_one_percent_more(monkeypatch):
    served = {((1, 3), 10.0): 184.0, ((1, 1), 10.0): 187.0, ((1, 3), 20.0): 188.0, ((1, 1), 20.0): 187.0,
              ((1, 3), 40.0): 207.0, ((1, 1), 40.0): 187.0, ((1, 3), 80.0): 208.0, ((1, 1), 80.0): 187.0,
              ((1, 3), 160.0): 207.5, ((1, 1), 160.0): 187.0}  # fmt: skip
    calls = []

    def fake(inputs, cfg):
        calls.append((cfg.thresholds, cfg.max_delay_ms, cfg.request_tokens))
        return type("R", (), {"throughput": served[(cfg.thresholds, cfg.max_delay_ms)]})()

    monkeypatch.setattr(tc, "simulate", fake)
    plan = {"serve": {"max_delay_ms": 10}}
    search = tc.search_timeouts(plan, two(), [(1, 3), (1, 1)], request_tokens=32)
    # 20 ms: (1, 3) at 188 is within 1 % of (1, 1)'s 187 at 10 ms; 40 ms wins; 80 ms is within 1 % of it
    assert (search.best, search.delay_ms, search.best_tok_s) == ((1, 3), 40.0, 207.0)
    assert [c[1] for c in calls] == [10.0, 10.0, 20.0, 20.0, 40.0, 40.0, 80.0, 80.0, 160.0, 160.0]
    assert {c[2] for c in calls} == {32}
    assert "B = (slm 1, llm 3) with max_delay_ms = 40 serves 207.0 tok/s" in search.line()
    assert "(the best at the plan's 10 ms: (slm 1, llm 1), 187.0)" in search.line()
    assert search.as_dict()["max_delay_ms"] == 40.0 and len(search.as_dict()["simulated"]) == 10
    assert tc.search_delays(0.0) == [0.0, 2.5, 5.0, 10.0, 20.0, 40.0] and tc.search_delays(50)[-1] == 200.0
