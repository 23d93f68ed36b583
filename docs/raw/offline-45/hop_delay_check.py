"""What a hop's delay does to a closed loop's throughput, and whether the chain could take it as a delay per token.

For every closed-loop TokenRouter and eager row served since the hop-delay counters (run 68 on), on the row's own
step times, routing and host gaps (`bench/matrix.py`'s `run_system`, `run_gap_ms`): the chain, the simulator as a
closed loop without and with the row's measured hop delays (`SimConfig.hop_ms`; 120 s, two seeds, no batching
timeout, as the chain), and a delay-station correction of the chain (`dtmc.with_transit`: X' = N / (N / X + Z) with
Z the transit time per committed token: hops into each model per token, from the chain's steps and batch sizes, times
its delay).
The correction holds the servers' response time fixed while a request is in transit; the simulator shows where
that is wrong.

    python3 docs/raw/offline-45/hop_delay_check.py docs/raw/run-a*/call*/run*/results-*.tar.gz
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import matrix  # noqa: E402

from tokenrouter.compiler.throughput.dtmc import ChainError, analyze, with_transit  # noqa: E402
from tokenrouter.compiler.throughput.inputs import with_step_ms  # noqa: E402
from tokenrouter.compiler.throughput.simulate import SimConfig, simulate  # noqa: E402


def closed_loop(inputs, b, seeds: int = 2, **kw) -> float:
    cfg = {"horizon_ms": 120_000.0, "warmup_ms": 2_000.0, **kw}
    return statistics.mean(simulate(inputs, SimConfig(b, seed=k, **cfg)).throughput for k in range(seeds))


def row(rec: dict, run: str) -> dict | None:
    if rec["mode"] not in ("tokenrouter", "eager") or rec.get("request_rate"):
        return None
    system = matrix.run_system(rec)
    if system is None:
        return None
    inputs, b = system
    hops, gaps = matrix.run_hop_ms(rec, inputs.models), matrix.run_gap_ms(rec, inputs.models)
    if hops is None or gaps is None:
        return None
    inputs = with_step_ms(inputs, gaps)
    try:
        chain = analyze(inputs, b)
    except ChainError:
        return None
    instant, delayed = closed_loop(inputs, b), closed_loop(inputs, b, hop_ms=hops)
    return {
        "run": run,
        "mode": rec["mode"],
        "B": b,
        "n": inputs.concurrency,
        "hop_ms": hops,
        "measured": rec["report"]["decode_throughput_tok_s"],
        "chain": chain.throughput,
        "instant": instant,
        "delayed": delayed,
        "corrected": with_transit(inputs, chain, hops),
    }


def main(paths: list[str]) -> None:
    out = []
    print("| run | mode | B | N | hop ms | measured | chain | sim, hops instant | sim, hops delayed | delayed / instant "
          "| correction / chain | measured / sim delayed |")  # fmt: skip
    print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for path in sorted(paths):
        for rec in matrix.load_records([path]):
            r = row(rec, Path(path).parent.name)
            if r is None:
                continue
            out.append(r)
            hops = ", ".join(f"{h:.2f}" for h in r["hop_ms"])
            print(f"| {r['run']} | {r['mode']} | {r['B']} | {r['n']} | {hops} | {r['measured']:.0f} | {r['chain']:.0f} | "
                  f"{r['instant']:.0f} | {r['delayed']:.0f} | {r['delayed'] / r['instant']:.3f} | "
                  f"{r['corrected'] / r['chain']:.3f} | {r['measured'] / r['delayed']:.3f} |", flush=True)  # fmt: skip
    effect = [r["delayed"] / r["instant"] for r in out]
    error = [(r["corrected"] / r["chain"]) / (r["delayed"] / r["instant"]) for r in out]
    print(f"\n{len(out)} rows. The hops' delay in the simulator: x{min(effect):.3f} to x{max(effect):.3f} "
          f"({sum(e > 1 for e in effect)} rows faster with it).")  # fmt: skip
    print(f"The delay-station correction over the simulator's effect: {min(error):.3f} to {max(error):.3f} "
          f"(mean {statistics.mean(error):.3f}, sd {statistics.pstdev(error):.3f}).")  # fmt: skip
    served = [r["measured"] / r["delayed"] for r in out]
    print(f"Measured / simulated with the delays: {min(served):.3f} to {max(served):.3f} "
          f"(mean {statistics.mean(served):.3f}); measured / chain with the gaps: "
          f"{min(r['measured'] / r['chain'] for r in out):.3f} to {max(r['measured'] / r['chain'] for r in out):.3f} "
          f"(mean {statistics.mean(r['measured'] / r['chain'] for r in out):.3f}).")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
