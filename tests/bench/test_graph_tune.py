"""bench/graph_tune.py's parts that need no GPU: the candidate configs (one K tile per program, within the
kernel's limits) and the table it writes, which `tuned_tiles` reads and the kernel's check accepts (the tuning
results kept in tests/fixtures/graph_tune, turned into the shipped table's H200 entries; its H100 entries are
bench/autotune_table.py's, kept in tests/fixtures/autotune)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tokenrouter.runtime.engine.attention import tuned_tiles

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "tests" / "fixtures" / "graph_tune"


@pytest.fixture
def graph_tune(bench_script):
    return bench_script("graph_tune")


@pytest.mark.parametrize("k", [1024, 2048, 3072])
def test_candidates_cover_k_in_one_tile(graph_tune, k):
    import triton

    from tokenrouter.runtime.engine.kernels import dot_rows as kd

    cands = graph_tune.dot_rows_candidates(k)
    assert len(cands) >= 10
    assert len({str(c) for c in cands}) == len(cands)  # no config twice
    for c in cands:
        kw = c.kwargs
        assert triton.cdiv(k, kw["SPLIT_K"]) <= kw["BLOCK_K"]
        kd.check_tile_config("dot_rows", dict(kw, num_warps=c.num_warps, num_stages=c.num_stages))


def test_the_table_it_writes_is_the_shipped_one(graph_tune, tmp_path):
    entries = []  # the 16-row block's tuning (its keys recorded before BLOCK_X), then the 32-row block's
    for raw in ("run-o/call2-graph_tune.json", "run-q/call1-graph_tune32cap.json"):
        entries += graph_tune.table_entries(json.loads((RAW / raw.replace("/", "-")).read_text()))
    # the 32-row down projection, tuned again over wider tiles
    (down,) = graph_tune.table_entries(json.loads((RAW / "run-q-call3-graph_tune_down32.json").read_text()))
    assert down["key"]["BLOCK_X"] == 32 and down["key"]["K"] == 3072
    entries = [down if e["key"] == down["key"] else e for e in entries]
    # and the folded norm's keys of the 16-row block (q/k/v of the first layer, of the others, gate/up)
    entries += graph_tune.table_entries(json.loads((RAW / "run-q-call4-graph_tune_norm16.json").read_text()))
    # and the one-token GEMV's five keys
    gemv = graph_tune.table_entries(json.loads((RAW / "run-r-call6-graph_tune_gemv.json").read_text()))
    # and the 2-row GEMV's five keys
    rows = graph_tune.table_entries(json.loads((RAW / "run-s-call1-graph_tune_rows.json").read_text()))
    # then the H100's: the autotuner's picks of a 0.6B + 8B start, read from Triton's cache (bench/autotune_table.py)
    h100 = json.loads((ROOT / "tests/fixtures/autotune/h100-0.6b-8b.json").read_text())["entries"]
    assert {e["gpu"] for e in h100} == {"NVIDIA H100 80GB HBM3"} and len(h100) == 18
    shipped = json.loads(tuned_tiles.SHIPPED.read_text())["entries"]
    assert entries + gemv + rows + h100 == shipped
    assert [e["key"]["BLOCK_X"] for e in entries] == [16] * 4 + [32] * 4 + [16] * 3
    assert [e["key"]["NORM"] for e in entries] == [False] * 8 + [True] * 3
    assert [e["kernel"] for e in gemv] == ["gemv"] * 5 and all("BLOCK_X" not in e["key"] for e in gemv)
    assert [(e["kernel"], e["key"]["BLOCK_M"]) for e in rows] == [("gemv_rows", 2)] * 5
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps({"entries": entries + gemv + rows}))
    table = tuned_tiles.read_table(path)
    assert len(table) == 21 and all(gpu == "NVIDIA H200" for gpu, _, _, _ in table)


def test_objective_steps(graph_tune):
    """--objective: extends BSxQ, all on one row block of dot_rows (up to 16 tokens, or 17-32); bad ones named."""
    assert graph_tune.objective_steps("1x4, 1X8") == [(1, 4), (1, 8)]
    assert graph_tune.objective_steps("4x8,16x2") == [(4, 8), (16, 2)]
    for bad in ("4x1", "1x4,4x8", "8x8", "x8", "", "4"):
        with pytest.raises(SystemExit, match="--objective"):
            graph_tune.objective_steps(bad)


def test_register_caps_reach_the_table(graph_tune):
    """A capped candidate (`--maxnreg`) keeps its tile, and the table written from it carries the cap in a form
    the kernel's check accepts; `table_config` reads it back."""
    import triton

    from tokenrouter.runtime.engine.kernels import dot_rows as kd

    base = triton.Config({"BLOCK_W": 32, "BLOCK_K": 256, "SPLIT_K": 8}, num_warps=4, num_stages=1)
    cap = graph_tune.capped(base, 128)
    assert cap.kwargs == base.kwargs and cap.maxnreg == 128 and base.maxnreg is None
    key = (1024, 2048, False, False, False, True, True, 32, "torch.bfloat16")
    results = dict(gpu="NVIDIA H200", dot_rows=[dict(key=repr(key), best=graph_tune._desc(cap))])
    (entry,) = graph_tune.table_entries(results)
    assert entry["config"] == dict(BLOCK_W=32, BLOCK_K=256, SPLIT_K=8, num_warps=4, num_stages=1, maxnreg=128)
    assert entry["key"]["BLOCK_X"] == 32 and entry["dtype"] == "bfloat16"
    kd.check_tile_config("dot_rows", entry["config"])
    back = graph_tune.table_config(entry["config"])
    assert back.kwargs == cap.kwargs and back.maxnreg == 128
    (plain,) = graph_tune.table_entries(
        dict(results, dot_rows=[dict(key=repr(key), best=graph_tune._desc(base))])
    )
    assert "maxnreg" not in plain["config"]


def test_explicit_tiles(graph_tune):
    got = graph_tune.explicit_tiles("64,256,12,4; 128,256,12,8")
    assert [(c.kwargs["BLOCK_W"], c.kwargs["SPLIT_K"], c.num_warps, c.num_stages) for c in got] == [
        (64, 12, 4, 1),
        (128, 12, 8, 1),
    ]
    assert graph_tune.explicit_tiles("") == []
    for bad, message in (
        ("64,256,12", "is not"),
        ("48,256,12,4", "powers of two"),
        ("64,256,64,4", "SPLIT_K"),
    ):
        with pytest.raises(ValueError, match=message):
            graph_tune.explicit_tiles(bad)


def test_gemv_rows_results_reach_the_table(graph_tune):
    """`--kernels gemv_rows` tunes the few-row GEMV's 2-row block: its results become table entries keyed like
    the GEMV's with BLOCK_M 2, in a form the kernel's check accepts (one candidate of its own list)."""
    import triton

    from tokenrouter.runtime.engine.kernels import dot_rows as kd
    from tokenrouter.runtime.engine.kernels import linear as kl

    best = kl._GEMV_FEW_CONFIGS[2][3]
    assert isinstance(best, triton.Config)
    key = (1024, 3072, True, False, False, True, "torch.bfloat16", "torch.bfloat16")
    (entry,) = graph_tune.table_entries(
        dict(gpu="G", gemv_rows=[dict(key=repr(key), best=graph_tune._desc(best))])
    )
    assert entry["kernel"] == "gemv_rows" and entry["dtype"] == "bfloat16"
    assert entry["key"] == dict(
        N=1024, K=3072, SILU_MUL=True, NORM=False, HAS_RES=False, USE_PDL=True, BLOCK_M=2
    )
    assert entry["config"] == dict(best.kwargs, num_warps=best.num_warps, num_stages=best.num_stages)
    for config in kl._GEMV_FEW_CONFIGS[2]:  # every candidate passes the check the engine applies to tables
        kd.check_tile_config("gemv_rows", dict(config.kwargs, num_warps=config.num_warps, num_stages=1))


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--kernels", "gemv,cublas"], "--kernels: cublas: expected dot_rows, gemv or gemv_rows"),
        (["--kernels", "gemv_rows"], "--kernels gemv_rows: its objective is a 2-token extend"),
    ],
)
def test_bad_kernel_choices_are_named_before_any_gpu_work(graph_tune, monkeypatch, tmp_path, argv, message):
    monkeypatch.setattr(sys, "argv", ["graph_tune.py", *argv, "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=message):
        graph_tune.main()
