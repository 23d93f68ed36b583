"""Per-request routings from the load generator's records (`throughput.workload`)."""

import json

import pytest

from tokenrouter.throughput.inputs import make_inputs
from tokenrouter.throughput.workload import WorkloadError, read_requests, request_routing


def pair(keep: int):
    return make_inputs(["slm", "llm"], {"slm": 1.0, "llm": 5.0}, [[0.9, 0.1], [1, 0]], [[1, keep], [1, 0]], 4)


def test_each_request_gets_its_own_entry_row():
    per = [{"ok": True, "hops": 1011, "tokens_per_model": {"slm": 6, "llm": 506}},  # run31.tar.gz's outlier
           {"ok": True, "hops": 0, "tokens_per_model": {"slm": 512}},
           {"ok": False, "hops": 0, "tokens_per_model": {}}]  # fmt: skip
    drop = pair(0)
    got = request_routing(drop, per)
    assert len(got) == 2  # the failed request is left out
    assert got[0][0, 1] == pytest.approx(506 / 512) and got[1][0, 1] == 0.0
    assert all((g.sum(axis=1) == 1).all() and (g[1] == drop.p[1]).all() for g in got)
    # a kept hop's token is the entry model's: 10 hops out among 100 entry tokens are 10 of 100 decisions
    got = request_routing(pair(1), [{"ok": True, "hops": 20, "tokens_per_model": {"slm": 100, "llm": 10}}])
    assert got[0][0, 1] == pytest.approx(10 / 100)


def test_bad_records_are_named():
    with pytest.raises(WorkloadError, match="no completed request"):
        request_routing(pair(0), [{"ok": False}])
    with pytest.raises(WorkloadError, match="request 0: tokens by big, not a model of the plan"):
        request_routing(pair(0), [{"ok": True, "hops": 0, "tokens_per_model": {"big": 3}}])
    three = make_inputs(["a", "b", "c"], {"a": 1, "b": 2, "c": 3}, [[1, 0, 0]] * 3, [[1, 1, 1]] * 3, 2)
    with pytest.raises(WorkloadError, match="two-model plan"):
        request_routing(three, [{"ok": True, "hops": 0, "tokens_per_model": {"a": 3}}])


def test_read_requests_takes_a_report_or_a_matrix_record(tmp_path):
    per = [{"ok": True, "hops": 2, "tokens_per_model": {"slm": 7, "llm": 1}}]
    (tmp_path / "report.json").write_text(json.dumps({"spec": {"output_len": 8}, "per_request": per}))
    (tmp_path / "record.json").write_text(json.dumps({"report": {"per_request": per}}))
    assert read_requests(tmp_path / "report.json") == (per, 8)
    assert read_requests(tmp_path / "record.json") == (per, None)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(WorkloadError, match="bad.json: not a readable JSON report"):
        read_requests(tmp_path / "bad.json")


def test_request_lengths_follow_the_completed_requests_or_are_none():
    from tokenrouter.throughput.workload import request_lengths

    per = [
        {"ok": True, "output_tokens": 7},
        {"ok": False, "output_tokens": 0},
        {"ok": True, "output_tokens": 2},
    ]
    assert request_lengths(per) == (7, 2)
    assert request_lengths([{"ok": True}]) is None  # records without the count: the report's length each
    assert request_lengths([{"ok": True, "output_tokens": 0}]) is None
