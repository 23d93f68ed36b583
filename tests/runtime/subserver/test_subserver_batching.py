"""Delayed batching's threshold rule and run decision (pure functions; no engine)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenrouter.runtime.subserver.batching import (
    START_REASONS,
    BatchingConfig,
    DelayedBatching,
    effective_thresholds,
    plan_thresholds,
)

thresholds = st.lists(st.integers(1, 40), min_size=1, max_size=5).map(
    lambda bs: {f"m{i}": b for i, b in enumerate(bs)}
)


@settings(max_examples=300, deadline=None)
@given(thresholds, st.integers(0, 200))
def test_effective_thresholds_fit_n_and_only_ever_lower(b, n):
    eff = effective_thresholds(b, n)
    assert list(eff) == list(b)
    assert sum(v - 1 for v in eff.values()) < max(n, 1)
    assert all(1 <= eff[k] <= b[k] for k in b)
    if sum(v - 1 for v in b.values()) < max(n, 1):
        assert eff == b  # already feasible: untouched
    # lowering stops as soon as the sum fits: the slack is exactly used up
    else:
        assert sum(v - 1 for v in eff.values()) == max(n, 1) - 1


@settings(max_examples=200, deadline=None)
@given(thresholds, st.integers(1, 100))
def test_effective_thresholds_monotone_in_n(b, n):
    lo, hi = effective_thresholds(b, n), effective_thresholds(b, n + 1)
    assert all(lo[k] <= hi[k] for k in b)


def test_largest_lowered_first_ties_in_model_order():
    b = {"a": 4, "b": 4, "c": 2}
    assert effective_thresholds(b, 8) == b  # Σ(B−1) = 7 < 8
    assert effective_thresholds(b, 7) == {"a": 3, "b": 4, "c": 2}
    assert effective_thresholds(b, 6) == {"a": 3, "b": 3, "c": 2}
    assert effective_thresholds(b, 4) == {"a": 2, "b": 2, "c": 2}
    assert effective_thresholds(b, 3) == {"a": 1, "b": 2, "c": 2}
    assert effective_thresholds(b, 1) == {"a": 1, "b": 1, "c": 1}
    assert effective_thresholds(b, 0) == {"a": 1, "b": 1, "c": 1}


def test_plan_thresholds_auto_is_one():
    plan = {"models": {"slm": {"batch": "auto"}, "llm": {"batch": 6}, "x": {}}}
    assert plan_thresholds(plan) == {"slm": 1, "llm": 6, "x": 1}


def test_should_run_threshold_and_timeout():
    cfg = BatchingConfig({"a": 3, "b": 2}, max_delay_ms=5.0)
    d = DelayedBatching(cfg, "a", n_active=10)
    assert d.threshold == 3
    assert not d.should_run(0, None, 100.0)
    assert d.should_run(3, 99.0, 99.0)
    assert not d.should_run(2, 99.0, 99.004)
    assert d.should_run(2, 99.0, 99.005)  # the oldest waited max_delay
    assert d.deadline(99.0) == pytest.approx(99.005)
    d.set_active(2)  # Σ(B−1) must be < 2: a is lowered first
    assert d.threshold == 1 and d.should_run(1, 0.0, 0.0)


def test_start_reason_names_the_rule_that_let_the_step_run():
    d = DelayedBatching(BatchingConfig({"a": 3, "b": 2}, max_delay_ms=5.0), "a", n_active=10)
    assert [d.start_reason(n) for n in (4, 3, 2)] == ["threshold", "threshold", "timeout"]
    d.set_active(2)  # B lowered to 1
    assert [d.start_reason(n) for n in (3, 1)] == ["threshold", "lowered"]
    d.set_active(10)
    assert [d.start_reason(2, n_held=h) for h in (2, 1, 3, None)] == ["held", "held", "timeout", "timeout"]
    assert d.start_reason(3, n_held=3) == "threshold"  # the threshold is named first
    assert set(START_REASONS) == {"threshold", "lowered", "held", "timeout"}


def test_a_step_runs_when_every_request_held_is_runnable():
    """No row the subserver knows of can join: it runs without waiting for B or the timeout; with one held
    request away (pending), it waits."""
    d = DelayedBatching(BatchingConfig({"a": 1, "b": 4}, max_delay_ms=20.0), "b", n_active=8)
    assert d.threshold == 4
    assert d.should_run(1, 0.0, 0.0, n_held=1) and d.should_run(2, 0.0, 0.0, n_held=2)
    assert not d.should_run(2, 0.0, 0.0, n_held=3)  # one held request may come back
    assert not d.should_run(2, 0.0, 0.0)  # not known: the threshold and the timeout only
    assert d.should_run(2, 0.0, 0.020, n_held=3)  # the timeout still bounds the wait
    assert not d.should_run(0, None, 0.0, n_held=0)  # nothing runnable: nothing to run


def test_the_newest_count_wins():
    d = DelayedBatching(BatchingConfig({"a": 1, "b": 5}, max_delay_ms=5.0), "b", n_active=1)
    assert d.set_active(8, count_seq=4) and (d.n_active, d.threshold, d.count_seq) == (8, 5, 4)
    assert not d.set_active(1, count_seq=3)  # older than the count held: ignored
    assert (d.n_active, d.threshold) == (8, 5)
    assert d.set_active(2, count_seq=4)  # the same number: the same count
    assert d.set_active(3, count_seq=9) and (d.n_active, d.threshold, d.count_seq) == (3, 3, 9)
    assert d.set_active(8) and d.count_seq == 9  # unnumbered: always taken, the number kept


def test_no_timeout():
    d = DelayedBatching(BatchingConfig({"a": 3}, max_delay_ms=None), "a", n_active=5)
    assert d.deadline(0.0) is None
    assert not d.should_run(2, 0.0, 1e9)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"thresholds": {}, "max_delay_ms": 1.0}, "at least one"),
        ({"thresholds": {"a": 0}, "max_delay_ms": 1.0}, "int >= 1"),
        ({"thresholds": {"a": 2.5}, "max_delay_ms": 1.0}, "int >= 1"),
        ({"thresholds": {"a": 1}, "max_delay_ms": -1.0}, "max_delay_ms"),
        ({"thresholds": {"a": 1}, "max_delay_ms": float("inf")}, "max_delay_ms"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchingConfig(**kwargs)


def test_unknown_model():
    with pytest.raises(ValueError, match="no batch threshold"):
        DelayedBatching(BatchingConfig({"a": 1}, 1.0), "b")
