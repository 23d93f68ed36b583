#!/usr/bin/env bash
# What would `tune` have chosen had the second co-location profile been served at a higher B_llm than 3?
# Offline, on this machine, from the raw results of runs 52-55: the served run at (1, B) stands in for the
# second profile (`bench/matrix.py --record-profile`). These records predate the uptime and threshold gauges
# in the records, so they are added here: uptime from 0 to the run's wall time, thresholds as served.
# Usage: bash docs/raw/run-y/whatif.sh RUN B    (e.g. 55 5); run from the repository root.
set -eu
run=$1; b=$2; root=$PWD; w=$(mktemp -d)
tar xzf "$(ls docs/raw/run-y/call*/run$run/results-*.tar.gz)" -C "$w"; cd "$w"/raw-*
python3 - "record-tokenrouter-n8-B1-$b.json" <<'PY'
import json, sys
rec = json.load(open(sys.argv[1]))
for m, b in rec["thresholds"].items():
    rec["metrics_before"][f'tokenrouter_uptime_seconds_total{{model="{m}"}}'] = 0.0
    rec["metrics_after"][f'tokenrouter_uptime_seconds_total{{model="{m}"}}'] = rec["report"]["wall_s"]
    rec["metrics_after"][f'tokenrouter_batch_threshold{{model="{m}"}}'] = float(b)
json.dump(rec, open("record-whatif.json", "w"))
PY
plan=$(ls 0.6b+8b-bern*.plan | grep -v -- -n8)
python3 "$root/bench/matrix.py" --record-profile record-whatif.json second.json > /dev/null
tokenrouter profile "$plan" --colocation profile-n8.json --colocation second.json -o colocated.json | grep "per unit"
tokenrouter tune "$plan" --profile colocated.json -n 8 --json -o whatif.plan 2> tune.err > tune.json || { cat tune.err; exit 1; }
grep -h warning tune.err || true
python3 - <<'PY'
import json
t = json.load(open("tune.json"))["tuning"]
print("terms (chain scale):", {m: v["ms_per_share"] for m, v in (t.get("colocation") or {}).items()})
for c in t["result"]["candidates"]:
    if c["thresholds"]["slm"] == 1:
        print(f"  B = {tuple(c['thresholds'].values())}: {c['throughput_tok_s']:.0f} tok/s predicted")
PY
rm -rf "$w"
