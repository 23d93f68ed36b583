#!/usr/bin/env bash
# Run 66 (twenty-seventh session): the busy board as step counters; one part (tuned and eager only), all the
# budget left allowed (290 s of device time).
# The eager profile from a server with the busy board carries the latencies alone (`alone_ms`), so `tune`
# takes each step's latency by whether the other model is running (docs/throughput.md, "Contention by
# state"); the matrix logs what the plain chain would have chosen. 20 ms timeout, N = 8. Copy it to .whl/ and
# give the runs their numbers (tags) before running; about 400 s.
# Runs from `.whl/clean.tgz` (`git archive --format=tar.gz HEAD tokenrouter bench pyproject.toml`).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c /tmp/work; mkdir -p /tmp/res /tmp/c; tar xzf .whl/clean.tgz -C /tmp/c; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
part() {  # tag policy max_delay_ms thresholds... ; the console's key lines after each part
  local tag=$1 pol=$2 delay=$3; shift 3
  local th=(); for t in "$@"; do th+=(--thresholds "$t"); done
  timeout 175 python3 bench/matrix.py --pair 0.6b+8b --policy $pol --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 160 \
    --max-delay-ms $delay "${th[@]}" \
    --tag $tag --out /tmp/res/$tag --work /tmp/work/$tag > /tmp/res/$tag.out 2>&1; echo rc_matrix_$tag=$?
  grep -E "co-location|tune N|fixed N|tok/s, tokens|warning" /tmp/res/$tag.out; grep -A8 "at each threshold" /tmp/res/$tag.out
  grep -A12 "Where the time goes" /tmp/res/$tag.out | grep "^| [te]"; grep -E "FAILED|SKIPPED" /tmp/res/$tag.out
}
part run66 bern0.35 20
grep -h "by state" /tmp/res/run*.out
grep -rh "stalled:" /tmp/work | head -10
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -300 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/call5.tgz -C /tmp/res .
