"""Do one served row's own latencies order the other thresholds of its run as they served?

The simulator, given everything a row measured, reproduces that row (`as_run_check.py`: 0.997 on the mean). A
tuner has the latencies of one row at most: those served at the thresholds it tried first. For every run that served
TokenRouter at two or more thresholds in a closed loop (with hop and gap counters: run 68 on), each of its rows in
turn lends its step times, routing, requests, hop delays and host gaps (`bench/matrix.py`'s `run_simulation` with
`at`: three seeds) to every threshold the run served; then, over the pairs of rows at different thresholds that
served at least 1 % apart, how many the donor's simulation orders as they served, and how many the chain does on
the same latencies with the donor's host gaps (`run_system`, `inputs.with_step_ms`; hops instant). The donor's own
pairs and the others' are counted apart: a donor's own row is priced on its own latencies, the other on latencies
measured at other thresholds.

    python3 docs/raw/offline-45/donor_order_check.py docs/raw/run-a*/call*/run*/results-*.tar.gz
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import matrix  # noqa: E402

from tokenrouter.compiler.throughput.dtmc import analyze  # noqa: E402
from tokenrouter.compiler.throughput.inputs import with_step_ms  # noqa: E402


def key(rec: dict, models: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(int((rec.get("thresholds") or {}).get(m, 1)) for m in models)


def chain_at(donor: dict, b: tuple[int, ...]) -> float | None:
    inputs, _ = matrix.run_system(donor)
    gaps = matrix.run_gap_ms(donor, inputs.models)
    return None if gaps is None else analyze(with_step_ms(inputs, gaps), b).throughput


def pairs(rows: list[dict], models: tuple[str, ...]):
    """The pairs of rows at different thresholds that served at least 1 % apart."""
    for i, a in enumerate(rows):
        for c in rows[i + 1 :]:
            ma, mc = (r["report"]["decode_throughput_tok_s"] for r in (a, c))
            if key(a, models) != key(c, models) and abs(ma - mc) >= 0.01 * max(ma, mc):
                yield a, c


def main(paths: list[str]) -> None:
    # [ordered as served by the simulation, by the chain, pairs counted]: with the donor's own row, of two others
    own, other = [0, 0, 0], [0, 0, 0]
    for path in sorted(paths):
        recs = [
            r for r in matrix.load_records([path]) if r["mode"] == "tokenrouter" and not r.get("request_rate")
        ]
        for n in sorted({r["n"] for r in recs}):
            rows = [r for r in recs if r["n"] == n]
            system = matrix.run_system(rows[0])
            if system is None or len({key(r, system[0].models) for r in rows}) < 2:
                continue
            models = system[0].models
            for donor in rows:
                sims, chains = {}, {}
                for b in {key(r, models) for r in rows}:
                    at = dict(zip(models, b, strict=True))
                    sims[b] = matrix.run_simulation(donor, hops=True, gaps=True, at=at)
                    chains[b] = chain_at(donor, b)
                if any(v is None for v in [*sims.values(), *chains.values()]):
                    continue
                line = []
                for a, c in pairs(rows, models):
                    ka, kc = key(a, models), key(c, models)
                    faster = a["report"]["decode_throughput_tok_s"] > c["report"]["decode_throughput_tok_s"]
                    ok, chain_ok = faster == (sims[ka] > sims[kc]), faster == (chains[ka] > chains[kc])
                    tally = own if donor is a or donor is c else other
                    tally[0] += ok
                    tally[1] += chain_ok
                    tally[2] += 1
                    line.append(
                        f"{ka} vs {kc}: {'ok' if ok else 'not'} (chain {'ok' if chain_ok else 'not'})"
                    )
                measured = ", ".join(
                    f"{key(r, models)} {r['report']['decode_throughput_tok_s']:.0f}" for r in rows
                )
                simulated = ", ".join(f"{b} {v:.0f} (chain {chains[b]:.0f})" for b, v in sorted(sims.items()))
                print(f"{Path(path).parent.name} N={n} donor {key(donor, models)}: served {measured}; simulated "
                      f"{simulated}; " + "; ".join(line), flush=True)  # fmt: skip
    for label, (sim, chain, total) in (("with the donor's own row", own), ("of two other rows", other)):
        print(f"pairs {label}: the simulation orders {sim} of {total} as served, the chain {chain}")


if __name__ == "__main__":
    main(sys.argv[1:])
