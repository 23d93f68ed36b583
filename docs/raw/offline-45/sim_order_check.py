"""Does the simulator, on the eager profile the chain tuned from, order the served rows better than the chain?

For every archived run that served TokenRouter at two or more thresholds in a closed loop: the profile that
`bench/retune.py` rebuilds (the eager profile, with the second profile the run lent or merged, if any), priced
for the rows' output length; each served B predicted by the chain (without and with the profile's host gaps),
and by the simulator as a closed loop of requests of that length with the run's `max_delay_ms` (120 s after 5 s,
three seeds), without and with the profile's hop delays and gaps. Then, over the pairs of rows at different B
that served at least 1 % apart, how many each orders as they served.

    python3 docs/raw/offline-45/sim_order_check.py docs/raw/run-a*/call*/run*/results-*.tar.gz
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import matrix  # noqa: E402
import retune  # noqa: E402

from tokenrouter.compiler.throughput.dtmc import analyze  # noqa: E402
from tokenrouter.compiler.throughput.from_metrics import profile_from_metrics  # noqa: E402
from tokenrouter.compiler.throughput.inputs import with_step_ms  # noqa: E402
from tokenrouter.compiler.throughput.plan_inputs import system_from_plan  # noqa: E402
from tokenrouter.compiler.throughput.simulate import SimConfig, simulate  # noqa: E402

KEYS = ("chain", "chain with gaps", "simulated", "simulated with hops and gaps")


def eager_system(files: dict, plan: dict, n: int, length: int):
    made = json.loads(files.get(f"profile-n{n}.json", b"{}") or b"{}").get("workload", {})
    steps, fit = made.get("min_steps", 5), made.get("alone_fit") == "non-decreasing"
    before = files.get(f"profile-metrics-n{n}-before.txt", b"").decode() or None
    prof = profile_from_metrics(plan, files[f"profile-metrics-n{n}-after.txt"].decode(), before, steps,
                                fit_alone=fit, prefill_above=matrix.prefill_above())  # fmt: skip
    lent = retune.archived_alone(files, plan, n, steps, fit)
    if lent is not None:
        prof = (
            retune.merge_served(prof, lent[1], lent[0])
            if lent[2]
            else retune.lend_alone(plan, prof, lent[1], lent[0])
        )
    return system_from_plan(plan, n, {}, {}, prof, length)


def predictions(system, b, max_delay_ms: float, length: int) -> dict[str, float]:
    inp = system.inputs
    gaps = tuple(system.gap_ms.get(m, 0.0) for m in inp.models) if system.gap_ms else None
    hops = tuple(system.hop_ms.get(m, 0.0) for m in inp.models) if system.hop_ms else None
    cfg = {
        "request_tokens": length,
        "max_delay_ms": max_delay_ms,
        "horizon_ms": 120_000.0,
        "warmup_ms": 5_000.0,
    }

    def sim(**kw) -> float:
        return statistics.mean(simulate(inp, SimConfig(b, seed=k, **cfg, **kw)).throughput for k in range(3))

    return {
        "chain": analyze(inp, b).throughput,
        "chain with gaps": analyze(inp if gaps is None else with_step_ms(inp, gaps), b).throughput,
        "simulated": sim(),
        "simulated with hops and gaps": sim(hop_ms=hops, gap_ms=gaps),
    }


def main(paths: list[str]) -> None:
    groups = []
    for path in sorted(paths):
        files = retune.read_archive(Path(path))
        recs = [json.loads(v) for k, v in sorted(files.items()) if k.startswith("record-tokenrouter")
                and k.endswith(".json")]  # fmt: skip
        recs = [r for r in recs if not r.get("request_rate")]
        bases = [k for k in files if k.endswith(".plan") and not re.search(r"-n\d+", k)]
        if len(bases) != 1 or not any(re.fullmatch(r"profile-metrics-n\d+-after\.txt", k) for k in files):
            continue
        plan = json.loads(files[bases[0]])
        for n in sorted({r["n"] for r in recs}):
            rows = [r for r in recs if r["n"] == n]
            if len({tuple(sorted((r.get("thresholds") or {}).items())) for r in rows}) < 2:
                continue
            length = rows[0]["output_len"]
            system = eager_system(files, plan, n, length)
            got = []
            for r in rows:
                b = tuple(int((r.get("thresholds") or {}).get(m, 1)) for m in system.inputs.models)
                pred = predictions(system, b, r.get("max_delay_ms", matrix.STDLIB_MAX_DELAY_MS), length)
                got.append({"B": b, "measured": r["report"]["decode_throughput_tok_s"], **pred})
            groups.append(got)
            cells = "; ".join(
                f"{g['B']} {g['measured']:.0f}: " + " / ".join(f"{g[k]:.0f}" for k in KEYS) for g in got
            )
            print(f"{Path(path).parent.name} N={n}: {cells}", flush=True)
    print(f"\nmeasured: {' / '.join(KEYS)}")
    for key in KEYS:
        ok = total = 0
        for rows in groups:
            for i, a in enumerate(rows):
                for b in rows[i + 1 :]:
                    if a["B"] == b["B"] or abs(a["measured"] - b["measured"]) < 0.01 * max(
                        a["measured"], b["measured"]
                    ):
                        continue
                    total += 1
                    ok += (a["measured"] > b["measured"]) == (a[key] > b[key])
        print(f"{key}: orders {ok} of {total} pairs as they served")


if __name__ == "__main__":
    main(sys.argv[1:])
