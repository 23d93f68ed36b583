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
    plan = bench.ablation_plan([512, 4096], [1, 4, 16], [2, 4, 8], [1, 4, 8, 16, 32, 64], 8, 8)
    singles = {off[0] for _, off, _ in plan if len(off) == 1}
    new = {*bench.NEW_AFTER_GEMV_ROWS}
    assert singles == {*new, *bench.NEW_SINCE_AB, "attn_stages", "attn_tiles", "gemv_rows"}
    assert singles <= set(bench.SWITCHES)
    before = [p for p in plan if len(p[1]) > 1]
    assert len(before) == 1 and set(before[0][1]) == {*new, *bench.NEW_SINCE_AB, "gemv_rows"}
    assert [p[1][0] for p in plan[:1]] == list(bench.NEW_AFTER_GEMV_ROWS)  # the newest first (the budget)
    by_name = {off[0]: points for _, off, points in plan if len(off) == 1}
    assert by_name["fused_merge"] == [(512, 1, 1), (4096, 1, 1), (512, 1, 2), (4096, 1, 2)]
    bs1_extends = [(ctx, 1, q) for ctx in (512, 4096) for q in (2, 4, 8)]
    assert by_name["gemv_norm"] == [(512, 1, 1), (4096, 1, 1)]  # one-token steps: decode bs 1
    assert by_name["attn_stages"] == [(512, 16, 8), (4096, 16, 8)]  # 32-row blocks: the largest extend
    # the KV tiles: the wide one at the largest extend, the narrow one at the one-request extends
    assert by_name["attn_tiles"] == [(512, 16, 8), (4096, 16, 8)] + bs1_extends
    # the few-row GEMV: every step of 2-8 tokens (bs 1 extends, decodes of bs 4 and 8, bs 4 x q 2)
    rows = [(1, 2), (1, 4), (1, 8), (4, 1), (4, 2), (8, 1)]
    assert by_name["gemv_rows"] == [(ctx, bs, q) for ctx in (512, 4096) for bs, q in rows]
    assert plan[2][0] == "no gemv_rows"  # right after "before"
    small = bench.ablation_plan([512], [1], [2, 4], [1], 2)  # gemv_rows_max 2: the 2-token extend only
    assert {off[0]: pts for _, off, pts in small if len(off) == 1}["gemv_rows"] == [(512, 1, 2)]
    one = bench.ablation_plan([512], [1, 4], [2, 4, 8], [1, 4, 8], 8, 1)  # gemv_rows_batch_max 1
    assert {off[0]: pts for _, off, pts in one if len(off) == 1}["gemv_rows"] == [
        (512, 1, q) for q in (2, 4, 8)
    ]
    assert all(p[1] for p in bench.ablation_plan([512], [], []))  # no extend asked: decode points only
    labels = [p[0] for p in bench.ablation_plan([512], [], [])]
    assert "no gemv_rows" not in labels  # no step of 2-8 tokens


def test_profile_cases(bench):
    assert bench.profile_cases("1x1@4096, 1x2@512,1X8@512") == [(1, 1, 4096), (1, 2, 512), (1, 8, 512)]
    for bad in ("1x2", "1x2@", "1y2@512", "0x2@512"):
        with pytest.raises(SystemExit, match="--profile-cases"):
            bench.profile_cases(bad)


def test_parse_steps(bench):
    """The bench scripts' one BSxQ parser (engine_bench, graph_tune)."""
    assert bench.parse_steps("4x1, 1x8,4X8", "--steps") == [(4, 1), (1, 8), (4, 8)]
    assert bench.parse_steps("16x2", "--objective", min_q=2, max_tokens=32) == [(16, 2)]
    for bad, kw, message in (
        ("4x1", dict(min_q=2), "--points: '4x1' is not BSxQ \\(requests x new tokens, q >= 2\\)"),
        ("8x8", dict(max_tokens=32), "at most 32 tokens"),
        ("", {}, "--points: give at least one BSxQ"),
        ("x8", {}, "'x8' is not BSxQ"),
        ("4", {}, "'4' is not BSxQ"),
    ):
        with pytest.raises(SystemExit, match=message):
            bench.parse_steps(bad, "--points", **kw)


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
    assert sum(t["target"].startswith("extend") for t in v) == 1  # no gemv_rows ablation rows: one


def test_extend_verdict_with_gemv_rows_off(bench):
    results = {
        "decode": [],
        "extend": [
            dict(shape="qwen3-0.6b", ctx=512, bs=1, q=2, graph_ms=0.95, decode_graph_ms=0.83),
            dict(shape="qwen3-0.6b", ctx=512, bs=4, q=8, graph_ms=1.2, decode_graph_ms=1.0),
        ],
        "ablation": [
            dict(shape="qwen3-0.6b", parts_off=["pdl"], ctx=512, bs=1, q=1, default_ms=0.83, off_ms=0.9),
            dict(
                shape="qwen3-0.6b", parts_off=["gemv_rows"], ctx=512, bs=1, q=2, default_ms=0.95, off_ms=1.3
            ),
            dict(shape="qwen3-0.6b", parts_off=["gemv_rows"], ctx=512, bs=4, q=1, default_ms=1.0, off_ms=1.1),
            dict(shape="qwen3-0.6b", parts_off=["gemv_rows"], error="RuntimeError: x"),  # a failed variant
        ],
    }
    on, off, bs1 = bench.target_verdicts(results)
    assert on["met"] and on["value"] == pytest.approx(1.2) and on["point"] == "qwen3-0.6b bs 4 q 8"
    assert "gemv_rows off" in off["target"] and not off["met"] and off["points_over"] == 1
    assert off["value"] == pytest.approx(1.3 / 0.83) and off["point"] == "qwen3-0.6b bs 1 q 2"
    # on at bs 1 only: the bs 1 extend keeps its time, the bs 4 decode takes the off one (1.2 / 1.1)
    assert "bs 1 only" in bs1["target"] and bs1["met"] and bs1["value"] == pytest.approx(0.95 / 0.83)
    results["extend"][1]["graph_ms"] = 1.45  # 1.45 / 1.1 = 1.32 at bs 1 only, 1.45 / 1.0 with it on
    on, _, bs1 = bench.target_verdicts(results)
    assert not on["met"] and not bs1["met"] and bs1["value"] == pytest.approx(1.45 / 1.1)
    results["extend"][1]["graph_ms"] = 1.2
    results["ablation"][1]["off_ms"] = 1.0  # 1.0 / 0.83 and 1.2 / 1.1: both within 1.3
    off = bench.target_verdicts(results)[1]
    assert off["met"] and off["value"] == pytest.approx(1.0 / 0.83) and off["points_over"] == 0
    # another part's ablation rows at the same points (here the fused merge's) replace no time: the same
    # three verdicts
    verdicts = bench.target_verdicts(results)
    results["ablation"].append(
        dict(shape="qwen3-0.6b", parts_off=["fused_merge"], ctx=512, bs=1, q=2, default_ms=0.95, off_ms=2.0)
    )
    assert bench.target_verdicts(results) == verdicts


def test_ablation_plan_times_dot_rows_first_where_it_acts(bench):
    """`dot_rows` (the tensor-core few-row kernel): its graph-tuned tiles and the kernel first in the plan, at the
    steps of 2 to dot_rows_max tokens that gemv_rows does not take; absent for models it does not act on
    (dot_rows_max 0)."""
    plan = bench.ablation_plan([512], [1, 4], [2, 4, 8], [1, 2, 4, 8], 4, 4, 16)
    assert plan[0][:2] == ("no tuned_tiles (the autotuner's dot_rows and GEMV tiles)", ("tuned_tiles",))
    assert plan[1][:2] == ("no dot_rows", ("dot_rows",))
    # bs 1 x 8, bs 4 x 2 / 4 (8 and 16 tokens), decode bs 8: the 2-4 token steps are gemv_rows'
    assert plan[1][2] == [(512, 1, 8), (512, 4, 2), (512, 4, 4), (512, 8, 1)]
    assert plan[0][2] == [(512, 1, 1), *plan[1][2]]  # and the tables' GEMV tiles: the decode bs 1
    plan = plan[1:]
    # up to 32 tokens: the 17-32 token steps (bs 4 x 8, decode bs 32) on cuBLAS first
    wide = bench.ablation_plan([512], [1, 4], [2, 4, 8], [1, 2, 4, 8, 32], 4, 4, 32)
    assert wide[0] == ("dot_rows_max=16 (17-32 token steps on cuBLAS)", ("dot_rows_max=16",),
                       [(512, 4, 8), (512, 32, 1)])  # fmt: skip
    assert wide[2][2] == [(512, 1, 8), (512, 4, 2), (512, 4, 4), (512, 4, 8), (512, 8, 1), (512, 32, 1)]
    assert bench.parts(wide[0][1]) == {"parts_off": [], "settings": {"dot_rows_max": 16}}
    # the folded norm where the tuned tables fold it (the 16-row block): off at those steps
    folded = bench.ablation_plan([512], [1, 4], [2, 4, 8], [1, 2, 4, 8, 32], 4, 4, 32, 16, 16)
    assert folded[4] == ("dot_rows_norm_max=0 (no folded norm)", ("dot_rows_norm_max=0",),
                         [(512, 1, 8), (512, 4, 2), (512, 4, 4), (512, 8, 1)])  # fmt: skip
    assert bench.parts(folded[4][1]) == {"parts_off": [], "settings": {"dot_rows_norm_max": 0}}
    # decodes have their own reach (the engine's default 16 rows): decode bs 32 is not a dot_rows step
    wide = bench.ablation_plan([512], [1, 4], [2, 4, 8], [1, 2, 4, 8, 32], 4, 4, 32, 16)
    assert wide[0][2] == [(512, 4, 8)]
    assert wide[2][2] == [(512, 1, 8), (512, 4, 2), (512, 4, 4), (512, 4, 8), (512, 8, 1)]
    # its weight prefetch off, same steps
    assert plan[1] == ("no dot_prefetch", ("dot_prefetch",), plan[0][2])
    assert bench.parts(plan[1][1]) == {"parts_off": ["dot_prefetch"]}
    # the few-row GEMV's 3-4 token steps (bs 1 x 4, decode bs 4) moved to dot_rows by a size setting
    assert plan[2] == (
        "gemv_rows_max=2 (3-4 token steps on dot_rows)",
        ("gemv_rows_max=2",),
        [(512, 1, 4), (512, 4, 1)],
    )
    assert bench.parts(plan[2][1]) == {"parts_off": [], "settings": {"gemv_rows_max": 2}}
    # with the default reach (2 tokens) dot_rows takes them: the row moves them back to the GEMV
    plan = bench.ablation_plan([512], [1, 4], [2, 4, 8], [1, 2, 4, 8], 2, 2, 16)[1:]
    assert plan[0][2] == [(512, 1, 4), (512, 1, 8), (512, 4, 1), (512, 4, 2), (512, 4, 4), (512, 8, 1)]
    label, names, points = plan[2]
    assert (label, points) == ("gemv_rows_max=4 (3-4 token steps on gemv_rows)", [(512, 1, 4), (512, 4, 1)])
    assert bench.parts(names) == {"parts_off": [], "settings": {"gemv_rows_max": 4, "gemv_rows_batch_max": 4}}
    # and the GEMV's own 2-token steps (bs 1 x 2, decode bs 2) on dot_rows
    assert plan[3] == (
        "gemv_rows_max=1 (2-token steps on dot_rows)",
        ("gemv_rows_max=1",),
        [(512, 1, 2), (512, 2, 1)],
    )
    assert bench.parts(("gemv_norm", "pdl")) == {"parts_off": ["gemv_norm", "pdl"]}
    assert all(
        label not in ("no dot_rows", "no tuned_tiles (the autotuner's dot_rows and GEMV tiles)")
        for label, _, _ in bench.ablation_plan([512], [1], [2, 4, 8], [1], 4, 4)
    )


def test_time_pair_alternates_the_two_steps(bench):
    """A B B A A B B A: each side's runs interleave with the other's, and each side's time is its own."""
    import time

    log = []

    def step(name, seconds):
        def run():
            log.append(name)
            time.sleep(seconds)

        return run

    a, b = bench.time_pair(step("a", 0.002), step("b", 0.004), target_s=0.01, rounds=4, sync=lambda: None)
    assert 0.0015 < a < 0.0035 and 0.0035 < b < 0.006 and b > a
    runs = [name for i, name in enumerate(log[7:]) if i == 0 or log[7 + i - 1] != name]  # after warm-up
    assert runs == ["a", "b", "a", "b", "a"]  # A | B B | A A | B B | A: four runs each, alternating


def test_named_ablation_times_each_part_at_every_step(bench):
    """--ablate: one row per named part (off, or a size set), at every measured step."""
    plan = bench.named_ablation("pdl, dot_prefetch,tuned_tiles,dot_rows_max=32", [512], [2, 4], [8], [4])
    steps = [(512, 4, 1), (512, 2, 8), (512, 4, 8)]
    assert plan == [
        ("no pdl", ("pdl",), steps),
        ("no dot_prefetch", ("dot_prefetch",), steps),
        ("no tuned_tiles", ("tuned_tiles",), steps),
        ("dot_rows_max=32", ("dot_rows_max=32",), steps),
    ]
    assert bench.parts(plan[3][1]) == {"parts_off": [], "settings": {"dot_rows_max": 32}}
    (combined,) = bench.named_ablation("pdl + dot_rows_max=16+gemv_norm", [512], [2, 4], [8], [4])
    assert combined == ("no pdl + dot_rows_max=16 + no gemv_norm", ("pdl", "dot_rows_max=16", "gemv_norm"),
                        steps)  # fmt: skip
    assert bench.parts(combined[1]) == {"parts_off": ["pdl", "gemv_norm"], "settings": {"dot_rows_max": 16}}
    for bad in (
        "dot_rows_norm",
        "wide_splits",
        "warp_drive",
        "dot_rows_max=many",
        "depth=3",
        "pdl+warp_drive",
        "pdl+",
    ):
        with pytest.raises(SystemExit, match="--ablate"):
            bench.named_ablation(bad, [512], [1], [8], [1])


def test_median_pass_keeps_a_measured_pair(bench):
    """--passes: a point reports the pass with the median extend / decode ratio, both times from that pass."""
    assert bench.median_pass([(1.0, 0.8)]) == (1.0, 0.8)
    runs = [(1.30, 1.0), (0.99, 0.75), (1.2, 1.0)]  # ratios 1.30, 1.32, 1.20
    assert bench.median_pass(runs) == (1.30, 1.0)
    assert bench.median_pass(runs[:2]) == (1.30, 1.0)  # the lower middle of two
    with pytest.raises(SystemExit):
        bench.main(["--passes", "0"])
