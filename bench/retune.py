"""Re-tune served runs offline with this checkout's throughput model, and hold its predictions against what
the runs served.

A matrix part that tunes from an eager profile keeps, in its results archive, the base plan and the two
/metrics scrapes the profile was read from (`profile-metrics-nN-before.txt` / `-after.txt`), and a record
of every row it served (`record-*-nN*.json`: the thresholds B and the measured decode tok/s). From those this
script rebuilds the profile (`profile --from-metrics --since`), runs the tuner (`tune -n N`), and gives the
chain's prediction at every B the run served. Where the run tuned on latencies alone lent by a second
served profile (`bench/matrix.py --alone-from`), that profile is rebuilt from its own scrapes and lent
again. So a change to the profile or the chain can be checked against every H200 run at once, before any
GPU time is spent on it. Rows: one per run, with the B the tuner
chooses now (and the B it chose at the time, from the archive's `tune-nN.json`), then each served row as
measured / predicted. Last, the spread of measured / predicted over every served row.

    python3 bench/retune.py docs/raw/run-a1/call*/run*/results-*.tar.gz
    python3 bench/retune.py --alone-from 2,5 --alone-from 2,6 docs/raw/run-a2/call*/run*/results-*.tar.gz
    python3 bench/retune.py --min-steps 20 docs/raw/run-a1/call*/run*/results-*.tar.gz
    python3 bench/retune.py --second-pass docs/raw/run-a*/call*/run*/results-*bern0.35*.tar.gz

`--second-pass` tunes in two passes, as `bench/matrix.py --served-from tuned` does on the GPU: each run's own
tuned row, served at the eager profile's choice, lends its latencies to the eager profile (`profile --merge`).

Exit status: 0, or 2 for bad options or an archive this cannot re-tune (named on stderr, with why; with
`--skip-unusable` it is named and left out).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import matrix  # noqa: E402  (bench/matrix.py: KEEP_PREFILLS, which `--keep-prefills` sets for both scripts)
from matrix import record_profile  # noqa: E402  (bench/matrix.py: a served row's profile from its record)

from tokenrouter.compiler.plan import PlanError, validate_plan  # noqa: E402
from tokenrouter.compiler.throughput.commands import lend_alone, merge_served  # noqa: E402
from tokenrouter.compiler.throughput.dtmc import analyze  # noqa: E402
from tokenrouter.compiler.throughput.from_metrics import MetricsProfileError, profile_from_metrics  # noqa: E402
from tokenrouter.compiler.throughput.inputs import with_step_ms  # noqa: E402
from tokenrouter.compiler.throughput.optimize import tune  # noqa: E402
from tokenrouter.compiler.throughput.plan_inputs import ThroughputInputError, system_from_plan  # noqa: E402

# the eager profile's later scrape (a second served profile's carries its tag: -nN-B-slm2,llm5-after.txt)
EAGER_AFTER = re.compile(r"profile-metrics-n(\d+)-after\.txt")


class ArchiveError(ValueError):
    """The archive lacks what a re-tune needs; the message says what."""


def read_archive(path: Path) -> dict[str, bytes]:
    """{file name: bytes} of an archive's files (their folders dropped: a part's archive has one)."""
    with tarfile.open(path) as tar:
        return {Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def retune(
    path: Path,
    min_steps: int | None = None,
    donor: dict[str, bytes] | None = None,
    alone_from=(),
    merge: bool = False,
    fit_alone: bool | None = None,
    second_pass: bool = False,
    gaps: bool = False,
) -> list[dict]:
    """Per N the archive profiled at: the tuner's choice now and at the time, and each served row's B,
    measured and predicted tok/s. `min_steps` None: the one the run's profile was made with (its
    `workload.min_steps`; 5 where it has none). `donor` (another archive's files) and `alone_from` (thresholds,
    in the order tried): the profile's latencies alone replaced by those the donor's first served row at one
    of them measured, model by model (`served_alone`). `merge`: that profile's (or the second profile's the run
    tuned with) latencies at every batch size it measured, alone and beside, replace the eager profile's
    (`merge_served`) instead of lending only the latencies alone. `fit_alone` None: the latencies alone fitted
    non-decreasing where the run's profile was (its `workload.alone_fit`: profiles from 3 Dec 2026 on), else as
    measured; True / False: every profile so. `second_pass`: tuning in two passes, offline: the latencies the run's
    own tuned row measured (served at the eager profile's choice) merged into the eager profile, for runs that
    tuned on the eager profile alone (none is lent to the others). `gaps`: each model's steps lengthened in the chain
    by the host gap between back-to-back steps that the eager profile measured (`tune --gap-ms profile`; profiles
    from run 66 on have it)."""
    files = read_archive(path)
    ns = sorted(int(m.group(1)) for m in map(EAGER_AFTER.fullmatch, files) if m)
    if not ns:
        raise ArchiveError(
            f"{path}: no profile-metrics-nN-after.txt (a part tuned from an eager profile has one)"
        )
    bases = [name for name in files if name.endswith(".plan") and not re.search(r"-n\d+", name)]
    if len(bases) != 1:
        raise ArchiveError(
            f"{path}: expected one base plan (PAIR-POLICY.plan), found {sorted(bases) or 'none'}"
        )
    plan = json.loads(files[bases[0]])
    try:
        validate_plan(plan, f"{path}:{bases[0]}")
    except PlanError as e:
        raise ArchiveError(str(e)) from None
    out = []
    for n in ns:
        after = files[f"profile-metrics-n{n}-after.txt"].decode()
        before = files.get(f"profile-metrics-n{n}-before.txt", b"").decode() or None
        made = json.loads(files.get(f"profile-n{n}.json", b"{}") or b"{}").get("workload", {})
        steps = min_steps or made.get("min_steps", 5)
        fit = made.get("alone_fit") == "non-decreasing" if fit_alone is None else fit_alone
        prof = profile_from_metrics(
            plan, after, before, steps, fit_alone=fit, prefill_above=matrix.prefill_above()
        )
        then = json.loads(files.get(f"tune-n{n}.json", b"{}") or b"{}").get("tuning", {}).get("result", {})
        b_then = tuple(then["best"][m] for m in plan["models"]) if "best" in then else None
        if second_pass:
            tuned_alone = archived_alone(files, plan, n, steps, fit) is None and b_then is not None
            lent = (
                served_alone(files, n, [b_then], steps, tuple(plan["models"]), fit) if tuned_alone else None
            )
            merged = True
        elif donor:
            lent = served_alone(donor, n, alone_from, steps, tuple(plan["models"]), fit)
            merged = merge
        else:
            lent = archived_alone(files, plan, n, steps, fit)
            merged = merge or (lent is not None and lent[2])
        if lent is not None:
            prof = (
                merge_served(prof, lent[1], lent[0]) if merged else lend_alone(plan, prof, lent[1], lent[0])
            )
        records = [json.loads(files[name]) for name in sorted(files)
                   if name.startswith("record-") and name.endswith(".json")]  # fmt: skip
        # the closed loops only: an open loop's rows serve the offered rate, not what the chain predicts
        records = [r for r in records if r.get("n") == n and r.get("mode") in ("tokenrouter", "eager")
                   and not r.get("request_rate")]  # fmt: skip
        # the rows' output length prices the profile's prompt prefills per request, as the matrix's `tune` does
        # since the fortieth session (its served profile's load has 256 tokens per request, the rows 512)
        length = next((r["output_len"] for r in records if isinstance(r.get("output_len"), int)), None)
        system = system_from_plan(plan, n, {}, {}, prof, None if matrix.KEEP_PREFILLS else length)
        inputs = system.inputs
        if gaps:
            if not system.gap_ms:
                raise ArchiveError(
                    f"{path}: the eager profile at N = {n} measured no step gaps (runs before 66)"
                )
            inputs = with_step_ms(inputs, tuple(system.gap_ms.get(m, 0.0) for m in inputs.models))
        best = tune(inputs, system.fixed).best
        rows = []
        for rec in records:
            b = tuple(int((rec.get("thresholds") or {}).get(m, 1)) for m in system.inputs.models)
            measured = rec["report"]["decode_throughput_tok_s"]
            rows.append({"mode": rec["mode"], "B": b, "measured": measured,
                         "predicted": analyze(inputs, b).throughput})  # fmt: skip
        out.append({"archive": path.name, "n": n, "models": system.inputs.models, "B": best.thresholds,
                    "predicted": best.throughput,
                    "B_then": b_then, "gap_ms": system.gap_ms if gaps else None,
                    "predicted_then": then.get("throughput_tok_s"), "rows": rows,
                    "alone_from": None if lent is None else lent[0] + (" (merged)" if merged else "")})  # fmt: skip
    return out


def served_alone(files: dict[str, bytes], n: int, alone_from, min_steps: int, models: tuple[str, ...],
                 fit_alone: bool = False):  # fmt: skip
    """(its B as text, its profile) for the first served TokenRouter row at N whose thresholds are one of
    `alone_from` (tried in order, each in the order of `models`): the busy board's alone steps of that row, for the models that have
    `min_steps` of them (`bench/matrix.py`'s `record_profile`); None where no such row is in `files`. An eager
    profile sees the small model alone only at the few batch sizes it runs while the large one holds no
    request; a row served at B_llm > 1 sees it alone at every batch size (docs/matrix.md, "Runs 72-78")."""
    records = [json.loads(data) for name, data in sorted(files.items())
               if name.startswith("record-tokenrouter") and name.endswith(".json")]  # fmt: skip
    for b in alone_from:
        for rec in records:
            got = tuple((rec.get("thresholds") or {}).get(m, 1) for m in models)
            if rec.get("n") == n and got == tuple(b):
                prof = record_profile(rec, min_steps, fit_alone)
                if prof is not None and prof.alone_ms:
                    return fmt_b(b), prof
    return None


def archived_alone(files: dict[str, bytes], plan: dict, n: int, min_steps: int, fit_alone: bool = False):
    """(the second profile's tag, that profile rebuilt from its scrapes, whether the run merged it) where the run
    itself tuned with a second served profile (`bench/matrix.py --alone-from`: `profile-nN-alone.json` names it
    as its `alone_source`; `--served-from`: `profile-nN-merged.json`, its `merged_from`), else None."""
    for suffix, key in (("alone", "alone_source"), ("merged", "merged_from")):
        made = json.loads(files.get(f"profile-n{n}-{suffix}.json", b"{}") or b"{}").get("workload", {})
        tag = Path(made.get(key, "")).name.removeprefix(f"profile-n{n}-").removesuffix(".json")
        after = files.get(f"profile-metrics-n{n}-{tag}-after.txt")
        if tag and after is not None:
            before = files.get(f"profile-metrics-n{n}-{tag}-before.txt", b"").decode() or None
            prof = profile_from_metrics(
                plan,
                after.decode(),
                before,
                min_steps,
                fit_alone=fit_alone,
                prefill_above=matrix.prefill_above(),
            )
            return tag, prof, suffix == "merged"
    return None


def fmt_b(b) -> str:
    return "-" if b is None else "(" + ", ".join(map(str, b)) + ")"


def table(results: list[dict]) -> str:
    lent = any(r.get("alone_from") for r in results)
    lines = ["| run | N | B chosen now | predicted | B chosen then | served: B measured / predicted |"
             + (" latencies alone (or merged) from |" if lent else ""),
             "| --- | ---: | --- | ---: | --- | --- |" + (" --- |" if lent else "")]  # fmt: skip
    ratios = []
    for r in results:
        served = []
        for row in r["rows"]:
            ratio = row["measured"] / row["predicted"]
            ratios.append(ratio)
            served.append(f"{row['mode']} {fmt_b(row['B'])} {row['measured']:.0f} / {row['predicted']:.0f} "
                          f"= {ratio:.2f}")  # fmt: skip
        run = r["archive"].removeprefix("results-").removesuffix(".tar.gz")
        lines.append(f"| {run} | {r['n']} | {fmt_b(r['B'])} | {r['predicted']:.0f} | {fmt_b(r['B_then'])} | "
                     f"{'; '.join(served)} |" + (f" {r.get('alone_from') or '-'} |" if lent else ""))  # fmt: skip
    pairs = ordered_pairs(results)
    if ratios:
        lines.append("")
        if any(r.get("gap_ms") for r in results):
            lines.append("the chain's steps lengthened by the host gaps each eager profile measured (--gaps)")
        if pairs[1]:
            lines.append(f"pairs of TokenRouter rows of one run that served at least {PAIR_GAP:.0%} apart: the chain "
                         f"orders {pairs[0]} of {pairs[1]} as they served")  # fmt: skip
        lines.append(f"measured / predicted over {len(ratios)} served rows: mean {statistics.mean(ratios):.3f}, "
                     f"from {min(ratios):.2f} to {max(ratios):.2f}, standard deviation "
                     f"{statistics.pstdev(ratios):.3f}")  # fmt: skip
    served = to_eager(results)
    if served:
        lines += [
            "",
            "| B served | rows | / eager of its run: mean | from | to |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for b, got in sorted(served.items(), key=lambda x: -statistics.mean(x[1])):
            lines.append(f"| {fmt_b(b)} | {len(got)} | {statistics.mean(got):.3f}x | {min(got):.3f}x | "
                         f"{max(got):.3f}x |")  # fmt: skip
    return "\n".join(lines)


def to_eager(results: list[dict]) -> dict[tuple, list[float]]:
    """{B: each TokenRouter row served at B (tuned or fixed) over the eager row of its run and N}."""
    out: dict[tuple, list[float]] = {}
    for r in results:
        eager = [x["measured"] for x in r["rows"] if x["mode"] == "eager"]
        for x in r["rows"]:
            if x["mode"] == "tokenrouter" and eager:
                out.setdefault(x["B"], []).append(x["measured"] / eager[0])
    return out


PAIR_GAP = 0.01  # rows of one run closer than this are left out of the ordering count (noise between rows)


def ordered_pairs(results: list[dict]) -> tuple[int, int]:
    """(how many, of the pairs of TokenRouter rows of one run at different thresholds that served PAIR_GAP or more
    apart, the chain's predictions order as they served; how many such pairs). Two rows at the same thresholds (a
    tuned row and a fixed one at its B) have one prediction: they are not a pair."""
    ok = total = 0
    for r in results:
        rows = [x for x in r["rows"] if x["mode"] == "tokenrouter"]
        for i, a in enumerate(rows):
            for b in rows[i + 1 :]:
                if a["B"] == b["B"]:
                    continue
                if abs(a["measured"] - b["measured"]) < PAIR_GAP * max(a["measured"], b["measured"]):
                    continue
                total += 1
                ok += (a["measured"] > b["measured"]) == (a["predicted"] > b["predicted"])
    return ok, total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "archives", nargs="+", help="results-*.tar.gz of matrix parts tuned from an eager profile"
    )
    ap.add_argument("--min-steps", type=int, default=None,
                    help="the profile's min_steps (default: each run's own, from its profile-nN.json)")  # fmt: skip
    ap.add_argument("--alone-from", action="append", default=[], metavar="B,B",
                    help="take the latencies alone from the previous archive's served row at these thresholds "
                    "(model order as in the table; repeatable: the first found; the first archive is skipped)")  # fmt: skip
    ap.add_argument("--merge", action="store_true",
                    help="with --alone-from, or on runs that tuned with a second profile: take that profile's "
                    "latencies at every batch size it measured, alone and beside (`profile --merge`), not only "
                    "its latencies alone")  # fmt: skip
    ap.add_argument("--fit-alone", action="store_true",
                    help="fit every profile's latencies alone non-decreasing in the batch size (as `profile "
                    "--from-metrics` does since 3 Dec 2026); default: as each run's profile was made")  # fmt: skip
    ap.add_argument("--second-pass", action="store_true",
                    help="tune in two passes: merge the latencies of each run's own tuned row (served at the eager "
                    "profile's choice) into its eager profile (`profile --merge`); runs that tuned with a second "
                    "profile are re-tuned without a loan")  # fmt: skip
    ap.add_argument("--keep-prefills", action="store_true",
                    help="leave the prompt prefills in the latencies of the batch sizes they ran at, as profiles "
                    "did before the fortieth session (default: priced apart, `profile --from-metrics`)")  # fmt: skip
    ap.add_argument("--gaps", action="store_true",
                    help="lengthen each model's steps in the chain by the host gap between back-to-back steps that "
                    "the eager profile measured (`tune --gap-ms profile`)")  # fmt: skip
    ap.add_argument("--skip-unusable", action="store_true",
                    help="name an archive this cannot re-tune on stderr and go on (default: exit 2 at the first)")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args(argv)
    matrix.KEEP_PREFILLS = a.keep_prefills
    if a.min_steps is not None and a.min_steps < 1:
        print(f"error: --min-steps must be >= 1, got {a.min_steps}", file=sys.stderr)
        return 2
    if a.second_pass and (a.alone_from or a.merge):
        print("error: --second-pass merges each run's own tuned row; it takes neither --alone-from nor --merge",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        alone_from = [tuple(int(x) for x in v.split(",")) for v in a.alone_from]
    except ValueError:
        print(f"error: --alone-from takes thresholds like 2,5, got {a.alone_from}", file=sys.stderr)
        return 2
    results, previous = [], None
    for p in map(Path, a.archives):
        try:
            if a.second_pass:
                results += retune(
                    p, a.min_steps, fit_alone=a.fit_alone or None, second_pass=True, gaps=a.gaps
                )
            elif not alone_from:
                results += retune(p, a.min_steps, merge=a.merge, fit_alone=a.fit_alone or None, gaps=a.gaps)
            elif previous is not None:
                results += retune(
                    p,
                    a.min_steps,
                    read_archive(previous),
                    alone_from,
                    a.merge,
                    a.fit_alone or None,
                    gaps=a.gaps,
                )
        except (OSError, tarfile.TarError, ArchiveError, MetricsProfileError, ThroughputInputError) as e:
            if not a.skip_unusable:
                print(f"error: {e}", file=sys.stderr)
                return 2
            print(f"skipped: {e}", file=sys.stderr)
        previous = p
    print(json.dumps(results, indent=1) if a.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
