"""bench/attn_probe.py's parts that need no GPU: the variant parser, and that a launch runs with the options
the engine's backend picks for its step (then the variant's one change)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def probe(bench_script):
    return bench_script("attn_probe")


def _backend():
    # imported here, not at collection (see tests/bench/conftest.py: Triton must not load before then)
    from tokenrouter.runtime.engine.attention.base import AttentionConfig
    from tokenrouter.runtime.engine.attention.triton_backend import TritonAttnBackend

    cfg = AttentionConfig(16, 8, 128, 128**-0.5, 1, torch.bfloat16, torch.device("cpu"))
    return TritonAttnBackend(cfg)


def test_parse_variants(probe):
    assert probe.parse_variants("zero_q, stages=3,permuted") == ["default", "zero_q", "stages=3", "permuted"]
    assert probe.parse_variants("") == ["default"]
    for bad in ("stages", "stages=x", "zero_q=1", "colour=2"):
        with pytest.raises(SystemExit):
            probe.parse_variants(bad)


def test_launch_options_follow_the_backend(probe):
    backend = _backend()
    backend.attn_decode_single_stage_bs = 2
    for bs, q_len in ((1, 1), (16, 1), (16, 8), (4, 2)):
        md = backend.metadata_for(bs, q_len)
        launch = probe.launch_options(backend, bs, q_len, "default")
        assert (launch["num_splits"], launch["num_stages"], launch["prefetch"]) == (
            md.num_splits,
            md.num_stages,
            md.prefetch,
        )
    assert probe.launch_options(backend, 1, 1, "default")["prefetch"] is True  # a decode of 1 reads early
    assert probe.launch_options(backend, 16, 1, "default")["num_stages"] == 2  # bs 16 pipelined
    changed = probe.launch_options(backend, 16, 8, "stages=3")
    assert changed["num_stages"] == 3 and changed["num_splits"] == backend.metadata_for(16, 8).num_splits
    assert probe.launch_options(backend, 16, 8, "zero_q") == probe.launch_options(backend, 16, 8, "default")


def test_joined_variants_and_the_sweep(probe):
    assert probe.parse_variants("block_n=128 + stages=3") == ["default", "block_n=128+stages=3"]
    with pytest.raises(SystemExit):
        probe.parse_variants("block_n=128+zero_q")
    sweep = probe.sweep_variants()
    assert sweep[0] == "default" and len(sweep) == 1 + 3 * 3 * 2 and len(set(sweep)) == len(sweep)
    backend = _backend()
    launch = probe.launch_options(backend, 16, 8, "block_n=128+stages=3+warps=8")
    assert (launch["block_n"], launch["num_stages"], launch["num_warps"]) == (128, 3, 8)
    # a split count forced from 1 takes the fused merge's tickets, as the backend's own launches do
    assert probe.launch_options(backend, 64, 1, "default")["tickets"] is None
    assert probe.launch_options(backend, 64, 1, "splits=4")["tickets"] is not None


def test_table_line(probe):
    row = dict(bs=16, q=8, ctx=4096, splits=2, block_n=128, stages=2, prefetch=False, us=70.0)
    kv = 2 * 16 * 4096 * 8 * 128 * 2  # 268 MB of K and V
    assert (
        probe.table_line(row, "best: x", kv, 95.0)
        == "| 16x8@4096 | best: x | 2 | 128 | 2 | no | 70.00 | 3835 | 0.737 |"
    )
    # the kernel's own tile, and a point whose default launch failed (nothing to compare with)
    line = probe.table_line({**row, "block_n": None, "prefetch": True}, "default", kv, None)
    assert line == "| 16x8@4096 | default | 2 | kernel's | 2 | yes | 70.00 | 3835 |  |"
