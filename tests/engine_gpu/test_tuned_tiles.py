"""Tile configs tuned inside the CUDA graph step (`tuned_tiles`): the shipped table parses and names the H200's
0.6B layers, lookups match GPU model, dtype and tuning key exactly, a table file (`EngineTuning.
tuned_tiles_files`) adds to it (and a bad one is named when a backend is built), and `dot_rows(tuned=True)` launches with the config the
table gives for its key (under the interpreter, where the real lookup finds no CUDA device)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from test_fused_ops import linear_case

from tokenrouter.runtime.engine.attention import tuned_tiles
from tokenrouter.runtime.engine.attention.base import AttentionConfig
from tokenrouter.runtime.engine.attention.triton_backend import TritonAttnBackend
from tokenrouter.runtime.engine.config import EngineTuning
from tokenrouter.runtime.engine.kernels import dot_rows as kd
from tokenrouter.runtime.engine.kernels import linear as kl

H200_QKV = dict(
    N=4096, K=1024, SILU_MUL=False, NORM=False, HAS_RES=False, USE_PDL=True, PREFETCH_W=True, BLOCK_X=16
)
CUDA = torch.device("cuda")  # only its type is read: no GPU needed with gpu_name patched


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(tuned_tiles, "gpu_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr(tuned_tiles, "_extra", ())  # the shipped table only, restored after the test


def test_shipped_table_names_the_h200_0_6b_layers(h200):
    table = tuned_tiles.read_table(tuned_tiles.SHIPPED)
    for (_, kernel, _, _), config in table.items():
        kd.check_tile_config(kernel, config)
    table = {
        key: config for key, config in table.items() if key[0] == "NVIDIA H200"
    }  # the H100's: the autotuner's
    gemv = {(dict(key)["N"], dict(key)["K"]) for _, kernel, _, key in table if kernel == "gemv"}
    assert gemv == {(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)}  # the one-token GEMV's
    rows = {
        (dict(key)["N"], dict(key)["K"], dict(key)["BLOCK_M"])
        for _, kernel, _, key in table
        if kernel == "gemv_rows"
    }
    assert rows == {
        (4096, 1024, 2),
        (1024, 2048, 2),
        (6144, 1024, 2),
        (1024, 3072, 2),
    }  # the 2-row GEMV's
    table = {key: config for key, config in table.items() if key[1] == "dot_rows"}
    keys = {(g, k, d, dict(key)["N"], dict(key)["K"], dict(key)["BLOCK_X"]) for g, k, d, key in table}
    assert keys == {  # the four layers, for the 16-row block and the 32-row one
        ("NVIDIA H200", "dot_rows", "bfloat16", n, k, bx)
        for n, k in ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072))
        for bx in (16, 32)
    }  # and the folded norm's for q/k/v and gate/up, 16-row block only
    assert {(dict(key)["N"], dict(key)["BLOCK_X"]) for _, _, _, key in table if dict(key)["NORM"]} == {
        (4096, 16),
        (6144, 16),
    }
    cfg = tuned_tiles.lookup("dot_rows", CUDA, torch.bfloat16, **H200_QKV)
    assert set(cfg) == {"BLOCK_W", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages"}
    gate_up = tuned_tiles.lookup("dot_rows", CUDA, torch.bfloat16, **(H200_QKV | dict(N=6144, BLOCK_X=32)))
    assert gate_up["maxnreg"] == 128  # the 32-row gate/up tile, tuned under a register cap
    assert cfg["SPLIT_K"] <= kd._DOT_ROWS_MAX_SPLIT
    # every part of the key counts: dtype, a flag, the GPU model, the device type
    assert tuned_tiles.lookup("dot_rows", CUDA, torch.float16, **H200_QKV) is None
    assert tuned_tiles.lookup("dot_rows", CUDA, torch.bfloat16, **(H200_QKV | {"PREFETCH_W": False})) is None
    wide = tuned_tiles.lookup("dot_rows", CUDA, torch.bfloat16, **(H200_QKV | {"BLOCK_X": 32}))
    assert wide is not None and wide != cfg  # the 32-row block's q/k/v tile is tuned on its own
    assert tuned_tiles.lookup("dot_rows", CUDA, torch.bfloat16, **(H200_QKV | {"BLOCK_X": 64})) is None
    assert tuned_tiles.lookup("gemv", CUDA, torch.bfloat16, **H200_QKV) is None
    gemv_qkv = dict(N=4096, K=1024, SILU_MUL=False, NORM=True, HAS_RES=True, USE_PDL=True)
    assert set(tuned_tiles.lookup("gemv", CUDA, torch.bfloat16, **gemv_qkv)) == {
        "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"
    }  # fmt: skip
    assert tuned_tiles.lookup("gemv", CUDA, torch.bfloat16, **(gemv_qkv | {"USE_PDL": False})) is None
    assert tuned_tiles.lookup("dot_rows", torch.device("cpu"), torch.bfloat16, **H200_QKV) is None


def test_a_table_file_adds_to_the_shipped_one(h200, monkeypatch, tmp_path):
    mine = dict(BLOCK_W=64, BLOCK_K=256, SPLIT_K=4, num_warps=8, num_stages=1)
    entries = [
        dict(gpu="NVIDIA H200", kernel="dot_rows", dtype="bfloat16", key=H200_QKV, config=mine),
        dict(gpu="Other GPU", kernel="dot_rows", dtype="float16", key=H200_QKV, config=mine),
    ]
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps({"entries": entries}))
    tuned_tiles.use_files((str(path),), kd.check_tile_config)
    assert tuned_tiles.lookup("dot_rows", CUDA, torch.bfloat16, **H200_QKV) == mine  # the file's entry wins
    monkeypatch.setattr(tuned_tiles, "gpu_name", lambda device: "Other GPU")
    assert tuned_tiles.lookup("dot_rows", CUDA, torch.float16, **H200_QKV) == mine
    other = dict(H200_QKV, N=1024, K=3072, SILU_MUL=True)  # a shipped H200 key: not for this GPU
    assert tuned_tiles.lookup("dot_rows", CUDA, torch.bfloat16, **other) is None
    # several files: a later file's entry over an earlier one's
    later = dict(mine, num_warps=4)
    second = tmp_path / "more.json"
    second.write_text(json.dumps({"entries": [dict(entries[1], config=later)]}))
    tuned_tiles.use_files((str(path), str(second)), kd.check_tile_config)
    assert tuned_tiles.lookup("dot_rows", CUDA, torch.float16, **H200_QKV) == later
    monkeypatch.setattr(tuned_tiles, "gpu_name", lambda device: "NVIDIA H200")
    assert tuned_tiles.lookup("dot_rows", CUDA, torch.bfloat16, **H200_QKV) == mine  # only in the first


@pytest.mark.parametrize(
    "text,message",
    [
        (None, "cannot read the tuned tile table"),
        ("{", "not JSON"),
        ('{"entries": {}}', "expected an object with a list of 'entries'"),
        ('{"entries": [{"gpu": "G", "kernel": "dot_rows", "dtype": "bfloat16", "key": {}, "config": {}}]}',
         "entry 0 needs"),
        ('{"entries": [{"gpu": "G", "kernel": "dot_rows", "dtype": "bfloat16", "key": {"N": 8}, "config": '
         '{"BLOCK_W": 32, "BLOCK_K": 256, "SPLIT_K": 64, "num_warps": 4, "num_stages": 1}}]}',
         "the entry for dot_rows on G, bfloat16, {'N': 8}: SPLIT_K 64: expected 1 to 12"),
        ('{"entries": [{"gpu": "G", "kernel": "gemv_few", "dtype": "bfloat16", "key": {"N": 8}, "config": '
         '{"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 1}}]}',
         "the entry for gemv_few on G, bfloat16, {'N': 8}: the engine reads tuned tiles for dot_rows, gemv and "
         "gemv_rows only, not 'gemv_few'"),
        ('{"entries": [{"gpu": "G", "kernel": "gemv_rows", "dtype": "bfloat16", "key": {"N": 8}, "config": '
         '{"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 1}}]}',
         "the entry for gemv_rows on G, bfloat16, {'N': 8}: BLOCK_K 256: gemv_rows loads 256 columns per warp"),
        ('{"entries": [{"gpu": "G", "kernel": "gemv", "dtype": "bfloat16", "key": {"N": 8}, "config": '
         '{"BLOCK_N": 24, "BLOCK_K": 256, "num_warps": 4, "num_stages": 1}}]}',
         "the entry for gemv on G, bfloat16, {'N': 8}: BLOCK_N 24, BLOCK_K 256: powers of two"),
        ('{"entries": [{"gpu": "G", "kernel": "gemv", "dtype": "bfloat16", "key": {"N": 8}, "config": '
         '{"BLOCK_N": 8, "BLOCK_K": 256, "SPLIT_K": 2, "num_warps": 4, "num_stages": 1}}]}',
         "the entry for gemv on G, bfloat16, {'N': 8}: expected the parameters"),
        ('{"entries": [{"gpu": "G", "kernel": "dot_rows", "dtype": "bfloat16", "key": {"N": 8}, "config": '
         '{"BLOCK_W": 24, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 1}}]}',
         "the entry for dot_rows on G, bfloat16, {'N': 8}: {'BLOCK_W': 24}: BLOCK_W and BLOCK_K must be powers"),
        ('{"entries": [{"gpu": "G", "kernel": "dot_rows", "dtype": "bfloat16", "key": {"N": 8}, "config": '
         '{"BLOCK_W": 32, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 1, "maxnreg": 300}}]}',
         "the entry for dot_rows on G, bfloat16, {'N': 8}: maxnreg 300: expected 32 to 255"),
    ],
)  # fmt: skip
def test_a_bad_table_file_is_named_when_a_backend_is_built(monkeypatch, tmp_path, text, message):
    path = tmp_path / "tiles.json"
    if text is not None:
        path.write_text(text)
    good = tmp_path / "good.json"  # a readable table before it: the bad one is still named
    good.write_text('{"entries": []}')
    tuning = EngineTuning(tuned_tiles_files=(str(good), str(path)))
    cfg = AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=16, scaling=0.25, num_layers=1,
                          dtype=torch.float32, device=torch.device("cpu"), tuning=tuning)  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(f"{path}: {message}")):
        TritonAttnBackend(cfg)


def test_gemv_launches_with_the_tuned_config(monkeypatch):
    """`gemv(tuned=True)` asks the tables for its key (N, K, the variant flags, PDL) and launches the plain
    kernel with the config it gets; the result is the autotuned launch's; without `tuned` (or with
    `extra_tiles=False`, the runs-A/B comparison) no lookup."""
    asked = []
    config = {"BLOCK_N": 8, "BLOCK_K": 16, "num_warps": 2, "num_stages": 1}
    kd.check_tile_config("gemv", config)

    def lookup(kernel, device, dtype, **key):
        asked.append((kernel, dtype, key))
        return dict(config)

    monkeypatch.setattr(kl.tuned_tiles, "lookup", lookup)
    x, w, b, _, _ = linear_case(5, 1, "bias")
    h = torch.randn_like(x)
    nw = torch.rand(x.shape[1], dtype=x.dtype) + 0.5
    plain = kl.gemv(x, w, b, norm_weight=nw, residual=h, residual_out=torch.empty_like(h))
    got = kl.gemv(x, w, b, norm_weight=nw, residual=h, residual_out=torch.empty_like(h), tuned=True)
    torch.testing.assert_close(got, plain, atol=1e-5, rtol=1e-5)
    key = dict(N=w.shape[0], K=w.shape[1], SILU_MUL=False, NORM=True, HAS_RES=True, USE_PDL=False)
    assert asked == [("gemv", w.dtype, key)]
    kl.gemv(x, w, b, tuned=True, extra_tiles=False)
    assert len(asked) == 1


def test_gemv_rows_launches_with_the_tuned_config(monkeypatch):
    """`gemv_rows(tuned=True)`: the lookup names the row block (BLOCK_M), the table's config is launched, and
    the result is the autotuned launch's; a config whose K tile does not match its warps is refused."""
    asked = []
    config = {"BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 2, "num_stages": 1}
    kd.check_tile_config("gemv_rows", config)

    def lookup(kernel, device, dtype, **key):
        asked.append((kernel, key))
        return dict(config)

    x, w, b, silu_mul, want = linear_case(11, 3, "silu_mul")
    plain = kl.gemv_rows(x, w, b, silu_mul=True)
    monkeypatch.setattr(kl.tuned_tiles, "lookup", lookup)
    got = kl.gemv_rows(x, w, b, silu_mul=True, tuned=True)
    torch.testing.assert_close(got, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    key = dict(N=40, K=72, SILU_MUL=True, NORM=False, HAS_RES=False, USE_PDL=False, BLOCK_M=4)
    assert asked == [("gemv_rows", key)]
    with pytest.raises(ValueError, match="256 columns per warp"):
        kd.check_tile_config("gemv_rows", dict(config, num_warps=4))


def test_dot_rows_launches_with_the_tuned_config(monkeypatch):
    asked = []
    config = {"BLOCK_W": 16, "BLOCK_K": 16, "SPLIT_K": 4, "num_warps": 4, "num_stages": 1}

    def lookup(kernel, device, dtype, **key):
        asked.append((kernel, dtype, key))
        return dict(config)

    monkeypatch.setattr(kl.tuned_tiles, "lookup", lookup)
    x, w, b, silu_mul, want = linear_case(7, 5, "silu_mul")
    got = kd.dot_rows(x, w, b, silu_mul=True, tuned=True)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    key = dict(
        N=40, K=72, SILU_MUL=True, NORM=False, HAS_RES=False, USE_PDL=False, PREFETCH_W=False, BLOCK_X=16
    )
    assert asked == [("dot_rows", w.dtype, key)]
    # the same config given directly: the same result, bit for bit; without `tuned` no lookup
    torch.testing.assert_close(kd.dot_rows(x, w, b, silu_mul=True, config=config), got, atol=0, rtol=0)
    # the split merge unrolled (`unroll_merge`, 4 splits here): the same sum in the same order, bit for bit
    unrolled = kd.dot_rows(x, w, b, silu_mul=True, config=config, unroll_merge=True)
    torch.testing.assert_close(unrolled, got, atol=0, rtol=0)
    kd.dot_rows(x, w, b, silu_mul=True)
    assert len(asked) == 1
    # a register cap (a launch option) is accepted in a tuned config and does not change the result
    kd.check_tile_config("dot_rows", dict(config, maxnreg=128))
    capped = kd.dot_rows(x, w, b, silu_mul=True, config=dict(config, maxnreg=128))
    torch.testing.assert_close(capped, got, atol=0, rtol=0)


def test_the_32_row_block_is_the_default_where_its_tiles_are_tuned(h200, monkeypatch):
    """Steps of 17-32 tokens beat cuBLAS only with tuned 32-row tiles (measured on the H200): a
    backend reaches 32 tokens by default for a GPU model and dtype that the tables cover, 16 otherwise or with
    the tables off; decodes 16 rows either way. Likewise the folded add & RMSNorm, for the row blocks whose
    folded tiles the tables hold (`dot_rows_norm_max`). Tiles are tuned per layer shape, so the model's
    counts too (its q/k/v projection's N and K)."""
    assert tuned_tiles.covers("dot_rows", CUDA, torch.bfloat16, BLOCK_X=32)
    assert tuned_tiles.covers("dot_rows", CUDA, torch.bfloat16, BLOCK_X=16, N=1024, K=3072)
    assert not tuned_tiles.covers("dot_rows", CUDA, torch.float16, BLOCK_X=32)
    assert not tuned_tiles.covers("dot_rows", CUDA, torch.bfloat16, BLOCK_X=64)
    assert not tuned_tiles.covers("dot_rows", torch.device("cpu"), torch.bfloat16, BLOCK_X=32)

    def reach(dtype, hidden=1024, tuned=True):  # the Qwen3-0.6B's attention and hidden size by default
        cfg = AttentionConfig(num_heads=16, num_kv_heads=8, head_dim=128, scaling=0.1, num_layers=1,
                              dtype=dtype, device=CUDA, hidden_size=hidden,
                              tuning=EngineTuning(tuned_tiles=tuned))  # fmt: skip
        backend = TritonAttnBackend(cfg)
        return backend.dot_rows_max, backend.dot_rows_decode_max, backend.dot_rows_norm_max

    assert reach(torch.bfloat16) == (32, 16, 16)  # folded norm: the 16-row block's tiles only
    assert reach(torch.float16) == (16, 16, 0)
    # another model (the 1.7B's attention, hidden 2048) or one of unknown shape: no tiles tuned for it
    assert reach(torch.bfloat16, hidden=2048) == (16, 16, 0)
    assert reach(torch.bfloat16, hidden=None) == (16, 16, 0)
    assert reach(torch.bfloat16, tuned=False) == (16, 16, 0)
