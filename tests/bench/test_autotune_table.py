"""bench/autotune_table.py: the autotuner's picks in Triton's disk cache (its `<kernel>.autotune.json` files, in
Triton 3.6's layout) become tuned tile entries that the engine's tables look up under the launch's own key."""

from __future__ import annotations

import json

import pytest

from tokenrouter.runtime.engine.attention import tuned_tiles


def _write(cache, name, key, timed, sub="h1"):
    d = cache / sub
    d.mkdir(parents=True)
    configs = [
        ({"kwargs": kw, "num_warps": w, "num_stages": s, "num_ctas": 1, "maxnreg": None, "pre_hook": None}, t)
        for kw, w, s, t in timed
    ]
    (d / f"{name}.autotune.json").write_text(json.dumps({"key": key, "configs_timings": configs}))


@pytest.fixture
def script(bench_script):
    return bench_script("autotune_table")


def _gemv_candidates(kl, configs, fast):
    return [(dict(c.kwargs), c.num_warps, c.num_stages, [2.0 if i != fast else 1.0, 1.9, 2.1])
            for i, c in enumerate(configs)]  # fmt: skip


def test_picks_become_entries_under_the_launch_key(script, tmp_path):
    from tokenrouter.runtime.engine.kernels import linear as kl

    gpu = "NVIDIA H100 80GB HBM3"
    gemv_key = [2048, 1024, False, True, True, True, "torch.bfloat16", "torch.bfloat16"]
    _write(tmp_path, "_gemv_kernel", gemv_key, _gemv_candidates(kl, kl._GEMV_CONFIGS, fast=3), "a")
    # the benchmark-only autotuner (the first tile list) is left out
    _write(tmp_path, "_gemv_kernel", gemv_key, _gemv_candidates(kl, kl._GEMV_CONFIGS_BASE, fast=0), "b")
    rows_key = [4096, 1024, True, False, False, True, "torch.bfloat16"]
    _write(tmp_path, "_gemv_few_kernel", rows_key, _gemv_candidates(kl, kl._GEMV_FEW_CONFIGS[4], fast=5), "c")
    dot_key = [3072, 1024, False, False, False, True, True, 16, "torch.bfloat16"]
    _write(tmp_path, "_dot_rows_kernel", dot_key, [
        ({"BLOCK_W": 32, "BLOCK_K": 256, "SPLIT_K": 4}, 4, 1, [3.0, 2.9, 3.1]),
        ({"BLOCK_W": 64, "BLOCK_K": 512, "SPLIT_K": 2}, 8, 1, [2.5, 2.4, 2.6]),
    ], "d")  # fmt: skip
    _write(tmp_path, "_some_other_kernel", [1], [({"B": 1}, 4, 1, 1.0)], "e")

    entries = script.collect(tmp_path, gpu)
    assert [e["kernel"] for e in entries] == ["dot_rows", "gemv", "gemv_rows"]
    by = {e["kernel"]: e for e in entries}
    fast = kl._GEMV_CONFIGS[3]
    assert by["gemv"]["config"] == dict(fast.kwargs, num_warps=fast.num_warps, num_stages=fast.num_stages)
    assert by["gemv"]["key"] == dict(N=2048, K=1024, SILU_MUL=False, NORM=True, HAS_RES=True, USE_PDL=True)
    assert by["gemv_rows"]["key"]["BLOCK_M"] == 4
    assert by["dot_rows"]["config"] == dict(BLOCK_W=64, BLOCK_K=512, SPLIT_K=2, num_warps=8, num_stages=1)
    assert all(e["dtype"] == "bfloat16" and e["gpu"] == gpu for e in entries)

    out, table = tmp_path / "t.json", tmp_path / "shipped.json"
    table.write_text(json.dumps({"about": "x", "entries": [dict(by["gemv"], config={"BLOCK_N": 8, "BLOCK_K": 512,
                                                                                "num_warps": 4, "num_stages": 2})]}))  # fmt: skip
    assert script.main(["--cache", str(tmp_path), "--gpu", gpu, "--out", str(out), "--into", str(table)]) == 0
    read = tuned_tiles.read_table(out)
    assert len(read) == 3
    merged = tuned_tiles.read_table(table)  # an entry already there (tuned in the graph step) stays
    assert len(merged) == 3
    assert merged[tuned_tiles._key(gpu, "gemv", "bfloat16", by["gemv"]["key"])]["BLOCK_N"] == 8


def test_not_a_directory_is_named(script, tmp_path):
    with pytest.raises(SystemExit, match="not a directory"):
        script.main(["--cache", str(tmp_path / "none"), "--gpu", "x"])
