"""bench/engine_bench.py's CPU-side parts: the --targets ablation plan and the target verdicts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "engine_bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("engine_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ablation_plan_covers_every_new_part_where_it_acts(bench):
    # imported here, not at collection: the Triton kernels module must first be imported after
    # tests/engine_gpu/conftest.py chose the interpreter (CPU)
    from tokenrouter.runtime.engine.attention.triton_backend import FAST_PATH_OPTIONS

    plan = bench.ablation_plan([512, 4096], [1, 4, 16], [2, 4, 8])
    singles = {off[0] for _, off, _ in plan if len(off) == 1}
    assert singles == {*bench.NEW_SINCE_AB, "attn_stages"} and singles <= FAST_PATH_OPTIONS.keys()
    before = [p for p in plan if len(p[1]) > 1]
    assert len(before) == 1 and set(before[0][1]) == set(bench.NEW_SINCE_AB)
    by_name = {off[0]: points for _, off, points in plan if len(off) == 1}
    assert by_name["gemv_norm"] == [(512, 1, 1), (4096, 1, 1)]  # one-token steps: decode bs 1
    assert by_name["attn_stages"] == [(512, 16, 8), (4096, 16, 8)]  # 32-row blocks: the largest extend
    assert all(p[1] for p in bench.ablation_plan([512], [], []))  # no extend asked: decode points only


def test_target_verdicts(bench):
    results = {
        "decode": [
            dict(shape="qwen3-0.6b", ctx=512, bs=1, graph_ms=0.98, floor_ms=0.28),
            dict(shape="qwen3-0.6b", ctx=4096, bs=1, graph_ms=1.10, floor_ms=0.28),
            dict(shape="qwen3-0.6b", ctx=512, bs=8, graph_ms=5.0, floor_ms=0.28),  # not a target point
            dict(shape="qwen3-8b", ctx=512, bs=1, graph_ms=4.6, floor_ms=3.8),
        ],
        "extend": [
            dict(shape="qwen3-8b", ctx=4096, bs=16, q=8, graph_ms=9.0, decode_graph_ms=7.0),
            dict(shape="qwen3-8b", ctx=512, bs=16, q=8, graph_ms=6.0, decode_graph_ms=5.5),
            dict(shape="qwen3-8b", ctx=512, bs=16, q=4, graph_ms=float("nan"), decode_graph_ms=5.5),
        ],
    }
    v = bench.target_verdicts(results)
    small = [t for t in v if t["target"].startswith("0.6B")]
    assert [(t["ctx"], t["met"]) for t in small] == [(512, True), (4096, False)]
    (big,) = [t for t in v if t["target"].startswith("8B")]
    assert big["value"] == pytest.approx(4.6 / 3.8) and big["met"]
    (ext,) = [t for t in v if t["target"].startswith("extend")]
    assert ext["value"] == pytest.approx(9 / 7) and ext["met"]  # 1.29 <= 1.3
    assert ext["points"] == 2 and ext["point"] == "qwen3-8b bs 16 q 8" and ext["ctx"] == 4096
    results["extend"][0]["graph_ms"] = 9.2  # 1.314: over
    assert not bench.target_verdicts(results)[-1]["met"]
