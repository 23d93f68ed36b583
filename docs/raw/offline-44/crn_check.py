"""Why `tune --request-rate` runs every candidate of a seed on the same arrivals (forty-fourth session): run
162's (2, 5) row (p = 0.1, at most 8 in flight, 4 requests/s) simulated on its own step times and hop delays
at four thresholds, six runs each of 300 s after a 10 s warm-up, once with the arrivals shared by seed
(`rate_tune.arrivals`, as the tuner runs them) and once with each run's own Poisson arrivals. Printed: the
time from arrival p99 of each run, and per threshold the difference to (2, 2), its mean and standard deviation
over the six seeds.

Usage: python3 docs/raw/offline-44/crn_check.py docs/raw/run-a15/call2/run162/results-*.tar.gz
"""

import importlib.util
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from tokenrouter.compiler.throughput.rate_tune import arrivals
from tokenrouter.compiler.throughput.simulate import SimConfig, simulate

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("matrix", ROOT / "bench" / "matrix.py")
matrix = importlib.util.module_from_spec(spec)
sys.modules["matrix"] = matrix
spec.loader.exec_module(matrix)

(rec,) = [
    r for r in matrix.load_records(sys.argv[1:]) if r["mode"] == "tokenrouter" and r["thresholds"]["llm"] == 5
]
inputs, _ = matrix.run_system(rec)
hop = matrix.run_hop_ms(rec, inputs.models)
CANDIDATES = [(2, 2), (1, 2), (2, 3), (2, 5)]
SEEDS = 6


def run(args) -> float:
    b, k, shared = args
    if shared:  # the tuner's: seed k's arrivals and routing draws for every candidate
        kw = {"arrivals_ms": arrivals(4.0, 310_000.0, k), "seed": k}
    else:  # each run its own: the simulator's Poisson loop, a seed per candidate and run
        kw = {"arrival_rate_per_s": 4.0, "seed": 1000 * k + 10 * b[0] + b[1]}
    cfg = SimConfig(
        b, request_tokens=512, max_delay_ms=20.0, hop_ms=hop, horizon_ms=300_000.0, warmup_ms=10_000.0, **kw
    )
    return simulate(inputs, cfg).latency["from_arrival_ms"]["p99"]


with ProcessPoolExecutor(2) as ex:
    for shared in (True, False):
        got = {b: np.array(list(ex.map(run, [(b, k, shared) for k in range(SEEDS)]))) for b in CANDIDATES}
        print("arrivals shared by seed" if shared else "each run its own arrivals")
        for b in CANDIDATES:
            print(f"  {b} from arrival p99 ms: {', '.join(f'{x:.0f}' for x in got[b])}")
        for b in CANDIDATES[1:]:
            d = got[b] - got[CANDIDATES[0]]
            print(f"  {b} - {CANDIDATES[0]}: mean {d.mean():+.0f} ms, sd {d.std(ddof=1):.0f} ms, "
                  f"{CANDIDATES[0]} lower in {int((d > 0).sum())} of {SEEDS}")  # fmt: skip
