#!/usr/bin/env bash
# call 2 of the twenty-fifth session (run X), a repeat of call 1: the co-location term on the chain's scale (3588d40: the slope
# over the plain chain's change of utilization between the two profiles' thresholds, not the server's busy
# share, which over-predicted run 45's B_llm = 8 by 1.46x). N = 8, tuned with the term beside eager and
# fixed (1, 1) and (1, 5) (past the profiled B_llm = 3): p = 0.1 (run 49) and p = 0.35 (run 50).
# Runs from `.whl/clean.tgz` (`git archive --format=tar.gz HEAD tokenrouter bench pyproject.toml`).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c; mkdir -p /tmp/res /tmp/c; tar xzf .whl/clean.tgz -C /tmp/c; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
timeout 270 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.1 --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 235 \
  --colocation llm=3 --thresholds slm=1,llm=1 --thresholds slm=1,llm=5 \
  --tag run49 --out /tmp/res/run49 --work /tmp/work > /tmp/res/run49.out 2>&1; echo rc_matrix_49=$?
grep -E "co-location|tune N|fixed N|tok/s, tokens" /tmp/res/run49.out; grep -A8 "at each threshold" /tmp/res/run49.out; grep -E "FAILED|SKIPPED" /tmp/res/run49.out
timeout 275 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.35 --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 240 \
  --colocation llm=3 --thresholds slm=1,llm=1 --thresholds slm=1,llm=5 \
  --tag run50 --out /tmp/res/run50 --work /tmp/work > /tmp/res/run50.out 2>&1; echo rc_matrix_50=$?
grep -E "co-location|tune N|fixed N|tok/s, tokens" /tmp/res/run50.out; grep -A8 "at each threshold" /tmp/res/run50.out; grep -E "FAILED|SKIPPED" /tmp/res/run50.out
grep -rh "stall" /tmp/work | head -20
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -200 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/call2.tgz -C /tmp/res .
