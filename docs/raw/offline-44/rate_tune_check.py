"""`tokenrouter tune --request-rate` (forty-fourth session) on the loads of runs 162, 166 (p = 0.1, at most 8 in
flight, 4 requests/s) and 163 (p = 0.35, at most 16, 3 requests/s), offline:

1. on the profile each run's closed-loop tuner used (`profile-nN.json`, from the run's eager closed loop), what
   the rate tuner chooses, beside the chain's choice that was served;
2. on each served row's own step times, hop delays and routing (`bench/matrix.py`'s `run_system`, as
   `openloop_check.py` simulates a row), what it chooses, and where the served thresholds rank;
3. each row's measured latencies.

A candidate that ran more than 5 % of a model's steps with more rows than that model was measured at is ranked
after the others ("[priced beyond]").

Usage: python3 docs/raw/offline-44/rate_tune_check.py docs/raw/run-a15/call{2,3,6}/run*/results-*.tar.gz
(also run on runs 155, 156 and 159: docs/raw/run-a14/call{1,2,5}/run*/results-*.tar.gz, rate_tune_check_a14.txt)
"""

import importlib.util
import json
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from tokenrouter.compiler.throughput.commands import SystemArgs, build_system
from tokenrouter.compiler.throughput.rate_tune import RateSettings, tune_at_rate

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("matrix", ROOT / "bench" / "matrix.py")
matrix = importlib.util.module_from_spec(spec)
sys.modules["matrix"] = matrix
spec.loader.exec_module(matrix)


def b_of(b) -> str:
    return "(" + ", ".join(map(str, b)) + ")"


def show(res, served=None) -> str:
    """The final round, each candidate's objective (and TPOT p50), and where the served thresholds ranked."""
    out = [
        f"{b_of(c.thresholds)} {c.score:.0f} ms (TPOT p50 {c.latency['tpot_ms']['p50']:.2f})"
        + (" [priced beyond]" if c.unpriced else "")
        for c in res.results
    ]
    if served is None:
        return ", ".join(out)
    rank = next((k + 1 for k, c in enumerate(res.results) if c.thresholds == served), None)
    first = next(((k + 1, c) for k, c in enumerate(res.screened) if c.thresholds == served), None)
    where = (
        f"rank {rank} of the final round"
        if rank
        else f"{first[0]} of the {len(res.screened)} screened"
        + (f", {max(first[1].beyond):.0%} of a model's steps priced beyond" if first[1].unpriced else "")
    )
    return ", ".join(out) + f"; served {b_of(served)}: {where}"


for tarball in sys.argv[1:]:
    recs = [r for r in matrix.load_records([tarball]) if r["mode"] == "tokenrouter"]
    rate, n, tokens = recs[0]["request_rate"], recs[0]["n"], recs[0]["output_len"]
    with tarfile.open(tarball) as tar, tempfile.TemporaryDirectory() as tmp:
        names = {Path(x).name: x for x in tar.getnames()}
        for name in (f"profile-n{n}.json", next(x for x in names if x.endswith(f"-n{n}.plan"))):
            Path(tmp, name).write_bytes(tar.extractfile(names[name]).read())
        plan_path = Path(tmp, next(x for x in names if x.endswith(f"-n{n}.plan")))
        plan, system = build_system(
            SystemArgs(str(plan_path), n, None, None, str(Path(tmp, f"profile-n{n}.json")), tokens)
        )
        chain = json.loads(plan_path.read_text())["tuning"]["result"]["best"]
    settings = RateSettings(rate, tokens, max_delay_ms=recs[0]["max_delay_ms"], jobs=2)
    res = tune_at_rate(system.inputs, settings, measured=system.profiled())
    print(
        f"## {Path(tarball).parent.name}: {rate:g} requests/s, N = {n}, {tokens} tokens, objective {settings.objective}"
    )
    print(
        f"- on the run's tuning profile (chain chose {b_of(chain.values())}): {res.unpriced} of {res.n_feasible} "
        f"priced beyond the measured batch sizes (ranked after), final round {show(res)}; {res.seconds:.0f} s"
    )
    for rec in recs:
        inputs, b = matrix.run_system(rec)
        hop = matrix.run_hop_ms(rec, inputs.models)
        own = tune_at_rate(
            inputs,
            RateSettings(rate, tokens, max_delay_ms=rec["max_delay_ms"], hop_ms=hop, jobs=2),
            measured=inputs.models,  # every latency of the row was measured
        )
        rep = rec["report"]
        if "from_arrival_s" not in rep:  # runs before the loadgen reported it: from each request's own times
            waits = sorted(r["queued_s"] + r["e2e_s"] for r in rep["per_request"] if r["ok"])
            rep["from_arrival_s"] = {"p99": float(np.percentile(waits, 99))}
        print(
            f"- on the served {b_of(b)} row's own inputs: final round {show(own, b)}; measured from arrival p99 "
            f"{rep['from_arrival_s']['p99'] * 1e3:.0f} ms, TPOT p50 {rep['tpot_ms']['p50']:.2f} ms"
        )
