#!/usr/bin/env bash
# call 3 of the twenty-fifth session (run X): does a longer batching timeout let delayed batching gain more
# over eager? Runs 47-50 served B_llm = 4-5 with 2.9-4.8 rows per 8B step: the plans' 5 ms max_delay, about
# one 8B step, starts the batch before the threshold is reached. Here every plan waits up to 20 ms
# (`--max-delay-ms 20`), N = 8, tuned with the co-location term, beside eager and one fixed threshold:
# p = 0.35 with (1, 5) (run 51; 1.11-1.13x eager at 5 ms in runs 48 and 50). Eager (B = 1) never waits.
# (A p = 0.1 part was cut: refused machine starts left 441 s of device time.)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c; mkdir -p /tmp/res /tmp/c; tar xzf .whl/clean.tgz -C /tmp/c; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
timeout 230 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.35 --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 195 \
  --max-delay-ms 20 --colocation llm=3 --thresholds slm=1,llm=5 \
  --tag run51 --out /tmp/res/run51 --work /tmp/work > /tmp/res/run51.out 2>&1; echo rc_matrix_51=$?
grep -E "co-location|tune N|fixed N|tok/s, tokens" /tmp/res/run51.out; grep -A7 "at each threshold" /tmp/res/run51.out; grep -A12 "Where the time goes" /tmp/res/run51.out | grep "^| [te]"
grep -rh "stalled:" /tmp/work | head -10
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -200 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/call3.tgz -C /tmp/res .
