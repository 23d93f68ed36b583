"""bench/graph_tune.py's parts that need no GPU: the candidate configs (one K tile per program, within the
kernel's limits) and the table it writes, which `tuned_tiles` reads and the kernel's check accepts (the run O
results, docs/raw/run-o, turned into the shipped table)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
graph_tune = pytest.importorskip("graph_tune")

from tokenrouter.runtime.engine.attention import triton_kernels as tk  # noqa: E402
from tokenrouter.runtime.engine.attention import tuned_tiles  # noqa: E402


@pytest.mark.parametrize("k", [1024, 2048, 3072])
def test_candidates_cover_k_in_one_tile(k):
    cands = graph_tune.dot_rows_candidates(k)
    assert len(cands) >= 10
    assert len({str(c) for c in cands}) == len(cands)  # no config twice
    for c in cands:
        kw = c.kwargs
        assert triton.cdiv(k, kw["SPLIT_K"]) <= kw["BLOCK_K"]
        tk.check_tile_config("dot_rows", dict(kw, num_warps=c.num_warps, num_stages=c.num_stages))


def test_the_table_it_writes_is_the_shipped_one(tmp_path):
    results = json.loads((ROOT / "docs/raw/run-o/call2-graph_tune.json").read_text())
    entries = graph_tune.table_entries(results)
    shipped = json.loads(tuned_tiles.SHIPPED.read_text())["entries"]
    assert entries == shipped
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps({"entries": entries}))
    table = tuned_tiles.read_table(path)
    assert len(table) == 4 and all(gpu == "NVIDIA H200" for gpu, _, _, _ in table)
