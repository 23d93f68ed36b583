"""bench/retune.py: served runs re-tuned offline from their archives' own scrapes."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN70 = next((ROOT / "docs/raw/run-a1/call3/run70").glob("results-*.tar.gz"))


def test_the_runs_own_tuning_is_reproduced_and_each_served_row_predicted(bench_script, capsys):
    """Run 70's archive: rebuilt from its scrapes with the min_steps its profile was made with, the tuner
    chooses what it chose on the H200, (2, 7) at the same prediction; each served row (eager, the tuned and
    the fixed (2, 5)) gets the chain's prediction at its B and its measured tok/s from the record."""
    retune = bench_script("retune")
    (got,) = retune.retune(RUN70)
    files = retune.read_archive(RUN70)
    then = json.loads(files["tune-n8.json"])["tuning"]["result"]
    assert got["models"] == ("slm", "llm") and got["n"] == 8
    assert got["B"] == got["B_then"] == (2, 7)
    assert got["predicted"] == pytest.approx(then["throughput_tok_s"], rel=1e-9)
    served = {(r["mode"], r["B"]): r for r in got["rows"]}
    assert set(served) == {("eager", (1, 1)), ("tokenrouter", (2, 7)), ("tokenrouter", (2, 5))}
    assert served[("tokenrouter", (2, 7))]["measured"] == pytest.approx(1934.3, abs=0.1)
    assert served[("tokenrouter", (2, 7))]["predicted"] == pytest.approx(then["throughput_tok_s"], rel=1e-9)
    fixed = json.loads(files["tune-0.6b+8b-bern0.35-n8-B2-5.json"])["tuning"]["result"]["throughput_tok_s"]
    assert served[("tokenrouter", (2, 5))]["predicted"] == pytest.approx(fixed, rel=1e-9)
    # another min_steps changes the profile, and so the choice
    (other,) = retune.retune(RUN70, min_steps=20)
    assert other["B"] != (2, 7) and other["B_then"] == (2, 7)
    assert retune.main([str(RUN70)]) == 0
    out = capsys.readouterr().out
    assert "| 0.6b_8b-bern0.35-custom-run70 | 8 | (2, 7) |" in out
    assert "tokenrouter (2, 7) 1934 / 1868 = 1.04" in out and "measured / predicted over 3 served rows" in out


def test_the_profiles_host_gaps_lengthen_the_chains_steps(bench_script, capsys):
    """`--gaps`: each model's steps take the host gap that the eager profile measured between back-to-back steps
    (run 70: 0.128 ms per 0.6B step, none counted for the 8B) as `tune --gap-ms profile` gives them: every served
    row's prediction is lower; the table says so. Two rows at the same thresholds are not a pair to order, and
    an open loop's rows (run 162) are left out: the chain predicts a closed loop."""
    retune = bench_script("retune")
    (plain,) = retune.retune(RUN70)
    (gapped,) = retune.retune(RUN70, gaps=True)
    assert plain["gap_ms"] is None and gapped["gap_ms"] == pytest.approx({"slm": 0.1277}, abs=1e-4)
    for a, b in zip(plain["rows"], gapped["rows"], strict=True):
        assert a["B"] == b["B"] and a["measured"] == b["measured"]
        assert 0.9 * a["predicted"] < b["predicted"] < a["predicted"]
    assert retune.main(["--gaps", str(RUN70)]) == 0
    assert "lengthened by the host gaps each eager profile measured (--gaps)" in capsys.readouterr().out
    same = {"rows": [{"mode": "tokenrouter", "B": (2, 6), "measured": 1900.0, "predicted": 2000.0},
                     {"mode": "tokenrouter", "B": (2, 6), "measured": 1800.0, "predicted": 2000.0},
                     {"mode": "tokenrouter", "B": (2, 5), "measured": 1700.0, "predicted": 1950.0}]}  # fmt: skip
    assert retune.ordered_pairs([same]) == (2, 2)
    run162 = next((ROOT / "docs/raw/run-a15/call2/run162").glob("results-*.tar.gz"))
    assert [r["rows"] for r in retune.retune(run162)] == [[]]


def test_an_archive_without_the_scrapes_is_named(bench_script, tmp_path, capsys):
    retune = bench_script("retune")
    bad = tmp_path / "results-x.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        data = b"{}"
        info = tarfile.TarInfo("raw-x/record-eager-n8.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert retune.main([str(bad)]) == 2
    assert f"error: {bad}: no profile-metrics-nN-after.txt" in capsys.readouterr().err
    assert retune.main(["--skip-unusable", str(bad), str(RUN70)]) == 0
    out = capsys.readouterr()
    assert (
        f"skipped: {bad}: no profile-metrics" in out.err
        and "| 0.6b_8b-bern0.35-custom-run70 | 8 |" in out.out
    )
    assert retune.main(["--min-steps", "0", str(RUN70)]) == 2
    assert retune.main([str(tmp_path / "nope.tar.gz")]) == 2


def test_latencies_alone_lent_by_the_previous_runs_served_row(bench_script, capsys):
    """`--alone-from 2,5`: run 76's profile takes the 0.6B's latencies alone from run 75's served (2, 5) row,
    which saw it alone at every batch size of 2-8 (the eager profile only at 1, 2, 3 and 5). The chain then
    ranks run 76's two served rows as they served ((2, 6) above (1, 4)), which the eager profile alone does
    not; the first archive has nothing before it and is left out."""
    retune = bench_script("retune")
    run75, run76 = (
        next((ROOT / f"docs/raw/run-a2/{c}").glob("results-*.tar.gz")) for c in ("call2/run75", "call3/run76")
    )
    (plain,) = retune.retune(run76)
    (lent,) = retune.retune(run76, donor=retune.read_archive(run75), alone_from=[(2, 5), (2, 6)])
    assert plain["alone_from"] is None and lent["alone_from"] == "(2, 5)"
    pred = {r["B"]: r["predicted"] for r in plain["rows"]}
    assert pred[(1, 4)] > pred[(2, 6)]  # the eager profile's ranking: the other way round from served
    pred = {r["B"]: r["predicted"] for r in lent["rows"]}
    served = {r["B"]: r["measured"] for r in lent["rows"]}
    assert served[(2, 6)] > served[(1, 4)] and pred[(2, 6)] > pred[(1, 4)]
    assert lent["rows"][0]["predicted"] != plain["rows"][0]["predicted"] or len(lent["rows"]) == 1
    # no row at the thresholds asked for: the profile is left as it is
    (none,) = retune.retune(run76, donor=retune.read_archive(run75), alone_from=[(3, 3)])
    assert none["alone_from"] is None and none["B"] == plain["B"]
    assert retune.main(["--alone-from", "2,5", str(run75), str(run76)]) == 0
    out = capsys.readouterr().out
    assert "latencies alone (or merged) from" in out and "run75" not in out and "| (2, 5) |" in out
    assert retune.main(["--alone-from", "two", str(run76)]) == 2


def test_a_run_tuned_on_lent_latencies_alone_is_retuned_with_the_same_loan(bench_script):
    """Run 79 tuned with `bench/matrix.py --alone-from slm=2,llm=5`: its archive holds the second profile's
    scrapes, which the re-tune rebuilds and lends again, reproducing the choice made on the H200, (3, 6), at
    its prediction; its own eager profile alone chooses (1, 6), as the run logged."""
    retune = bench_script("retune")
    run79 = next((ROOT / "docs/raw/run-a2/call5/run79").glob("results-*.tar.gz"))
    (got,) = retune.retune(run79)
    then = json.loads(retune.read_archive(run79)["tune-n8.json"])["tuning"]["result"]
    assert got["alone_from"] == "B-slm2,llm5" and got["B"] == got["B_then"] == (3, 6)
    assert got["predicted"] == pytest.approx(then["throughput_tok_s"], rel=1e-9)
    own = json.loads(retune.read_archive(run79)["tune-n8-eager-alone.json"])["tuning"]["result"]["best"]
    assert (own["slm"], own["llm"]) == (1, 6)


def test_merged_latencies_of_the_previous_runs_served_row_choose_the_best_row_served(bench_script, capsys):
    """`--merge --alone-from 2,6`: runs 83 and 84 (docs/raw/run-a3) take every latency the previous run's served
    (2, 6) row measured, alone and beside, at its batch sizes, and the eager profile's at the rest. The tuner
    then chooses (2, 6), the best row each served but for run 84's (2, 7) 0.9 % above it, where lending the
    latencies alone only chooses the edge (3, 6) and the eager profile (2, 5), as the run did."""
    retune = bench_script("retune")
    runs = [next((ROOT / "docs/raw/run-a3").glob(f"call*/run{k}/results-*.tar.gz")) for k in (82, 83, 84)]
    for before, run in zip(runs, runs[1:], strict=False):
        (merged,) = retune.retune(run, donor=retune.read_archive(before), alone_from=[(2, 6)], merge=True)
        served = {r["B"]: r["measured"] for r in merged["rows"] if r["mode"] == "tokenrouter"}
        assert merged["B"] == (2, 6) and served[(2, 6)] >= 0.99 * max(served.values())
    (lent,) = retune.retune(runs[2], donor=retune.read_archive(runs[1]), alone_from=[(2, 6)])
    (plain,) = retune.retune(runs[2])
    assert lent["B"] == (3, 6) and plain["B"] == plain["B_then"] == (2, 5)
    # run 84: only (2, 7) and (2, 5) served 1 % or more apart, and the merged chain has them the other way round
    assert retune.ordered_pairs([merged]) == (0, 1) and retune.ordered_pairs([plain]) == (0, 1)
    assert retune.main(["--merge", "--alone-from", "2,6", *map(str, runs[1:])]) == 0
    out = capsys.readouterr().out
    assert "| 0.6b_8b-bern0.35-custom-run84 | 8 | (2, 6) |" in out and "run83 " not in out
    assert "B-" not in out and "| (2, 6) (merged) |" in out
    # each threshold served, over the eager row of its run: (2, 6) 1872.2 / 1573.8
    assert "| (2, 6) | 1 | 1.190x | 1.190x | 1.190x |" in out


def test_hop_burst_counts_what_each_wake_up_found(bench_script):
    """bench/hop_burst.py: packed, every wake-up of the receiver finds a whole burst; one message per hop, the
    wake-ups find every hop sent, in pieces or whole."""
    burst = bench_script("hop_burst")
    assert burst.wakeups(4, 10, packed=True) == {4: 10}
    found = burst.wakeups(4, 10, packed=False)
    assert sum(k * n for k, n in found.items()) == 40
    assert burst.main(["--size", "1"]) == 2


def test_latencies_alone_fitted_non_decreasing_move_the_merged_tuner_to_the_best_row_served(
    bench_script, capsys
):
    """Runs 86 and 89 tuned on the eager profile merged with a second profile served at (2, 5), and chose (2, 5);
    that profile had the 0.6B alone at 3 rows slower than at 4 (a state it rarely ran in). Re-tuned with the
    latencies alone fitted non-decreasing (`--fit-alone`, as `profile --from-metrics` now builds them) they
    choose (2, 6), which served 1.023x and 1.047x their (2, 5) beside it; as made, the choice of the run."""
    retune = bench_script("retune")
    for k in (86, 89):
        run = next((ROOT / "docs/raw/run-a4").glob(f"call*/run{k}/results-*.tar.gz"))
        (made,) = retune.retune(run)
        (fitted,) = retune.retune(run, fit_alone=True)
        assert made["B"] == made["B_then"] == (2, 5) and made["alone_from"] == "B-slm2,llm5 (merged)"
        assert fitted["B"] == (2, 6)
        served = {r["B"]: r["measured"] for r in fitted["rows"] if r["mode"] == "tokenrouter"}
        assert served[(2, 6)] > 1.02 * served[(2, 5)]
    assert retune.main(["--fit-alone", str(run)]) == 0
    assert "| 0.6b_8b-bern0.35-custom-run89 | 8 | (2, 6) |" in capsys.readouterr().out


def test_a_second_pass_merges_the_runs_own_tuned_row_and_moves_its_choice_to_the_best_row_served(
    bench_script, capsys
):
    """`--second-pass`: runs 82 and 84 tuned on the eager profile alone and chose (2, 5). With the latencies
    their own (2, 5) row measured merged into that profile, they choose (2, 6), which served within 1 % of the
    best row of its run; run 91, which tuned with a second profile of its own, is re-tuned without a loan."""
    retune = bench_script("retune")
    for k in (82, 84):
        run = next((ROOT / "docs/raw/run-a3").glob(f"call*/run{k}/results-*.tar.gz"))
        (got,) = retune.retune(run, second_pass=True)
        assert got["B_then"] == (2, 5) and got["alone_from"] == "(2, 5) (merged)" and got["B"] == (2, 6)
        served = {r["B"]: r["measured"] for r in got["rows"] if r["mode"] == "tokenrouter"}
        assert served[(2, 6)] >= 0.99 * max(served.values()) and served[(2, 6)] > served[(2, 5)]
    run91 = next((ROOT / "docs/raw/run-a5").glob("call*/run91/results-*.tar.gz"))
    (alone,) = retune.retune(run91, second_pass=True)
    assert alone["alone_from"] is None
    assert retune.main(["--second-pass", str(run)]) == 0
    assert "| 0.6b_8b-bern0.35-custom-run84 | 8 | (2, 6) |" in capsys.readouterr().out
    assert retune.main(["--second-pass", "--merge", str(run)]) == 2
    assert "takes neither --alone-from nor --merge" in capsys.readouterr().err
