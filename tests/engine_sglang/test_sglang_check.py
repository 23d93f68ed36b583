"""`bench/sglang_check.py`, the one GPU command for issue 8: its pure parts on CPU (agreement of routing traces,
/metrics parsing, throughput ratios, the summary), and that it refuses to start without CUDA or SGLang."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import sglang_check as chk  # noqa: E402


def test_agreement_counts_positions_and_first_divergence():
    emb = [{"trace": ["slm", "slm", "llm", "slm"], "text": "abcd"}, {"trace": ["slm"] * 4, "text": "xyz"}]
    sgl = [{"trace": ["slm", "llm", "llm", "slm"], "text": "abXd"}, {"trace": ["slm"] * 4, "text": "xyz"}]
    ag = chk.agreement(emb, sgl)
    assert ag["requests"] == 2
    assert ag["trace_agree_mean"] == (3 / 4 + 1) / 2
    assert [p["first_trace_divergence"] for p in ag["per_request"]] == [1, None]
    assert ag["positions_before_first_divergence"] == (1 + 4) / 8
    assert ag["texts_equal"] == 1
    assert ag["per_request"][0]["text_common_prefix"] == 0.5
    assert ag["llm_share_embedded"] == (1 / 4 + 0) / 2 and ag["llm_share_sglang"] == (2 / 4) / 2


def test_metrics_and_kv_pages():
    text = "\n".join([
        "# HELP tokenrouter_kv_pages_free free",
        'tokenrouter_kv_pages_total{model="slm"} 100',
        'tokenrouter_kv_pages_free{model="slm"} 60',
        'tokenrouter_kv_pages_total{model="llm"} 50',
        'tokenrouter_kv_pages_free{model="llm"} 50',
        "tokenrouter_requests_active 2",
        'tokenrouter_requests_finished_total{reason="abort"} 4',
    ])  # fmt: skip
    m = chk.parse_metrics(text)
    assert (
        m["tokenrouter_requests_active"] == 2
        and m['tokenrouter_requests_finished_total{reason="abort"}'] == 4
    )
    assert chk.kv_pages(m) == {"slm": {"total": 100, "free": 60}, "llm": {"total": 50, "free": 50}}


def test_perf_ratios_against_sglang_only():
    runs = [
        {"mode": "tr-embedded", "n": 4, "tok_s": 340.0},
        {"mode": "tr-sglang", "n": 4, "tok_s": 170.0},
        {"mode": "tr-embedded", "n": 8, "tok_s": 500.0},  # no sglang-only run at N = 8: no ratio
        {"mode": "sglang-only", "n": 4, "tok_s": 100.0},
    ]
    assert chk.perf_ratios(runs) == [
        {"mode": "tr-embedded", "n": 4, "ratio_vs_sglang_only": 3.4},
        {"mode": "tr-sglang", "n": 4, "ratio_vs_sglang_only": 1.7},
    ]


def test_summary_markdown_lists_stages_figures_and_errors():
    summary = {
        "started": "now",
        "stages": {
            "api": {
                "status": "ok",
                "seconds": 12.0,
                "result": {
                    "agreement": chk.agreement(
                        [{"trace": ["slm"], "text": "a"}], [{"trace": ["slm"], "text": "a"}]
                    )
                },
            },  # fmt: skip
            "perf": {
                "status": "failed (exit 1)",
                "seconds": 3.0,
                "result": {
                    "runs": [
                        {
                            "mode": "sglang-only",
                            "n": 4,
                            "tok_s": 100.0,
                            "ttft_p50_ms": 5.0,
                            "tpot_p50_ms": 1.0,
                            "tokens_per_model": None,
                            "startup_s": 30.0,
                        }
                    ]
                },
                "error": "Traceback: boom",
            },  # fmt: skip
            "decode": {"status": "skipped (10 s left, needs 60)"},
        },
    }
    md = chk.summary_markdown(summary)
    assert "| api | ok | 12 |" in md and "| decode | skipped (10 s left, needs 60) | 0 |" in md
    assert "trace agreement 1.000" in md and "| sglang-only | 4 | 100.0 |" in md
    assert "## perf: error" in md and "Traceback: boom" in md


def test_without_sglang_it_exits_3(tmp_path):
    script = str(REPO / "bench" / "sglang_check.py")
    code = (
        "import sys, runpy; sys.modules['sglang'] = None; sys.argv = [sys.argv[1], '--out', sys.argv[2]]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, script, str(tmp_path / "o")], capture_output=True, text=True
    )
    assert out.returncode == 3, out.stderr
    assert "needs SGLang and a CUDA device" in out.stderr
    assert not (tmp_path / "o").exists()
