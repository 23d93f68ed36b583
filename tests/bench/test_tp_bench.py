"""bench/tp_bench.py on the CPU: the decode step of a model over two gloo ranks and on one, one row per size."""

from __future__ import annotations

import json


def test_two_ranks_and_one_are_timed(bench_script, tmp_path, capsys):
    tp_bench = bench_script("tp_bench")
    out = tmp_path / "tp.json"
    tp_bench.main(["--shape", "tiny", "--device", "cpu", "--gpus", "0,1", "--decode-bs", "2", "--ctx", "4",
                   "--steps", "1", "--json", str(out)])  # fmt: skip
    rows = json.loads(out.read_text())
    assert [(r["tp"], r["bs"]) for r in rows] == [(1, 2), (2, 2)]
    assert all(r["step_ms"] > 0 and r["floor_ms"] is None for r in rows)
    assert rows[1]["weights_per_gpu_gb"] < rows[0]["weights_per_gpu_gb"]  # each rank holds its share
    table = capsys.readouterr().out
    assert "| 2 | 2 |" in table and "TP=1 / this" in table
