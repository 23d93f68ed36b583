"""bench/concurrency.py: each model's counters over a load, and the table's ratio to llm-only."""

from __future__ import annotations

import pytest


@pytest.fixture
def cc(bench_script):
    return bench_script("concurrency")


def test_per_model_counts_the_load_only(cc):
    before = {("steps_total", (("model", "llm"),)): 10.0, ("step_rows_total", (("model", "llm"),)): 40.0}
    after = {
        ("steps_total", (("model", "llm"),)): 30.0,
        ("step_rows_total", (("model", "llm"),)): 240.0,
        ("step_seconds_total", (("model", "llm"),)): 0.2,
        ("step_starts_total", (("model", "llm"), ("reason", "timeout"))): 5.0,
        ("step_starts_total", (("model", "llm"), ("reason", "threshold"))): 15.0,
        ("steps_by_shape_total", (("bs", "24"), ("model", "llm"), ("overlap", "alone"), ("q", "2"))): 3.0,
        ("steps_by_shape_total", (("bs", "24"), ("model", "llm"), ("overlap", "alone"), ("q", "1"))): 4.0,
        ("steps_by_shape_total", (("bs", "96"), ("model", "llm"), ("overlap", "alone"), ("q", "1"))): 2.0,
        ("requests_active", ()): 0.0,
    }
    m = cc.per_model(before, after)["llm"]
    assert (m["steps"], m["rows"], m["timeout"], m["wide"]) == (20.0, 200.0, 5.0, 5.0)
    assert m["seconds"] == pytest.approx(0.2)


def test_the_table_divides_by_llm_only_at_the_same_n(cc):
    model = {"llm": {"steps": 10, "rows": 40, "seconds": 0.05, "timeout": 1, "wide": 0}}
    rows = [
        {"config": "llm-only", "n": 16, "tok_s": 2000.0, "ttft_p50_ms": 30.0, "models": model},
        {"config": "tokenrouter llm=12", "n": 16, "tok_s": 3000.0, "ttft_p50_ms": 20.0, "models": model},
        {"config": "tokenrouter llm=12", "n": 32, "tok_s": 5000.0, "ttft_p50_ms": 20.0, "models": model},
        {
            "config": "tokenrouter auto",
            "n": 16,
            "tok_s": 2500.0,
            "ttft_p50_ms": 25.0,
            "models": model,
            "simulated_tok_s": 2600.0,
        },
    ]
    text = cc.table(rows)
    assert "| tokenrouter llm=12 | 16 | 3000.0 | 1.50x | - | 20 | llm: 10, 4.0, 5.00, 10, 0 |" in text
    assert "| tokenrouter llm=12 | 32 | 5000.0 | - | - |" in text
    assert "| tokenrouter auto | 16 | 2500.0 | 1.25x | 2600.0 | 25 |" in text
