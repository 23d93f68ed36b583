#!/usr/bin/env bash
# Call 2 of the twenty-eighth session: two parts at p = 0.35 (tuned by state, eager, (2, 5)), now with the hop delay column.
# A call prepared in the twenty-seventh session for the next one (not run yet): tune by state with the busy
# board's step counters (a step alone only when no co-runner step overlapped it; runs 59-65 were served with the
# first board, whose "alone" steps were overlapped: docs/throughput.md, "Contention by state"). The eager
# profile carries the latencies alone (`alone_ms`; where they are few, the latencies beside scaled by their ratio); `tune` takes each
# step's latency by state; the matrix logs what the plain chain would have chosen. 20 ms timeout, N = 8. The
# questions: how many of the 0.6B's eager steps the counters find alone, and at what latency (expected
# 1.4-1.8 ms); whether the tuner then chooses B_slm = 2 with B_llm = 4-6 at p = 0.35 ((2, 4)-(2, 6) served
# 1.16-1.20× eager in runs 59-65) and (2, 3) at p = 0.1; whether the tuned row reaches 1.2× eager. Copy it to
# .whl/, give the runs their numbers (tags) and run it; about 400 s.
# Runs from `.whl/clean.tgz` (`git archive --format=tar.gz HEAD tokenrouter bench pyproject.toml`).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c /tmp/work; mkdir -p /tmp/res /tmp/c; tar xzf .whl/clean.tgz -C /tmp/c; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
part() {  # tag policy max_delay_ms thresholds... ; the console's key lines after each part
  local tag=$1 pol=$2 delay=$3; shift 3
  local th=(); for t in "$@"; do th+=(--thresholds "$t"); done
  timeout 275 python3 bench/matrix.py --pair 0.6b+8b --policy $pol --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 235 \
    --max-delay-ms $delay "${th[@]}" \
    --tag $tag --out /tmp/res/$tag --work /tmp/work/$tag > /tmp/res/$tag.out 2>&1; echo rc_matrix_$tag=$?
  grep -E "co-location|tune N|fixed N|tok/s, tokens|warning" /tmp/res/$tag.out; grep -A8 "at each threshold" /tmp/res/$tag.out
  grep -A12 "Where the time goes" /tmp/res/$tag.out | grep "^| [te]"; grep -E "FAILED|SKIPPED" /tmp/res/$tag.out
}
part run68 bern0.35 20 slm=2,llm=5
part run69 bern0.35 20 slm=2,llm=5
grep -h "by state" /tmp/res/run*.out
for f in /tmp/work/*/*/raw-*/profile-n8.json; do  # the eager profile's latencies alone and the steps behind them
  python3 -c "import json, sys; p = json.load(open(sys.argv[1])); print(sys.argv[1], 'alone', p.get('alone_ms'), 'beside', p.get('beside_ms'), p['workload'].get('steps_by_state'))" "$f"
done
grep -rh "stalled:" /tmp/work | head -10
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -300 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/call2.tgz -C /tmp/res .
