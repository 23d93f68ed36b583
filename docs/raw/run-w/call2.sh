#!/usr/bin/env bash
# call 2 of the twenty-fourth session (run W): does the co-located tuner's push to a high B_llm hold?
# Run 47: p = 0.35, N = 8, co-located tuning beside fixed (1, 3) and (1, 5) (the fit extrapolates from B_llm = 3).
# Run 48: p = 0.1, N = 4 (the target point), co-located tuning beside (1, 1).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c; mkdir -p /tmp/res /tmp/c; tar xf .whl/clean.tar -C /tmp/c; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
timeout 300 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.35 --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 265 \
  --colocation llm=3 --thresholds slm=1,llm=3 --thresholds slm=1,llm=5 \
  --tag run47 --out /tmp/res/run47 --work /tmp/work > /tmp/res/run47.out 2>&1; echo rc_matrix_47=$?
grep -E "co-location|tune N" /tmp/res/run47.out; grep -A8 "at each threshold" /tmp/res/run47.out; grep -E "FAILED|SKIPPED" /tmp/res/run47.out
timeout 240 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.1 --run tokenrouter:4 --run eager:4 --rounds 6 --deadline-s 205 \
  --colocation llm=3 --thresholds slm=1,llm=1 \
  --tag run48 --out /tmp/res/run48 --work /tmp/work > /tmp/res/run48.out 2>&1; echo rc_matrix_48=$?
grep -E "co-location|tune N" /tmp/res/run48.out; grep -A6 "at each threshold" /tmp/res/run48.out; grep -E "FAILED|SKIPPED" /tmp/res/run48.out
grep -rh "stall" /tmp/work | head -20
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -200 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/call2.tgz -C /tmp/res .
