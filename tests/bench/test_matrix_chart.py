"""bench/matrix.py's chart (drawn with tokenrouter.plotting): one panel per pair and policy, at its size."""

from __future__ import annotations

import struct


def test_the_chart_has_a_panel_per_pair_and_policy(tmp_path, bench_script):
    matrix = bench_script("matrix")
    records = [
        {"pair": pair, "policy": "bern0.35", "mode": mode, "n": n, "predicted_tok_s": 90.0 if mode == "tokenrouter" else None,
         "report": {"decode_throughput_tok_s": 100.0 + n}}
        for pair in ("tiny", "small") for mode in ("tokenrouter", "llm-only") for n in (2, 4)
    ]  # fmt: skip
    out = tmp_path / "sub" / "chart.png"
    matrix.chart(records, out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1200, 480)  # two panels of 5 x 4 inches at 120 dpi
