#!/usr/bin/env bash
# call 4 of the twenty-second session (run V): run 44, p = 0.1, N = 8, TokenRouter at fixed thresholds again
# (run 43: B_llm = 2-3 measured 1.08-1.09x eager, the DTMC ranked them below (1, 1); the tuned (1, 1) server
# read 0.91x): B_llm = 3, 4, 5, and (1, 1) served a second time for the spread between server starts
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 330 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.1 --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 300 \
  --thresholds llm=3 --thresholds llm=4 --thresholds llm=5 --thresholds slm=1,llm=1 \
  --tag run44 --out /tmp/res/run44 --work /tmp/work > /tmp/res/run44.out 2>&1; echo rc_matrix_44=$?
grep -A10 "at each threshold" /tmp/res/run44.out; grep -E "FAILED|SKIPPED" /tmp/res/run44.out
tar czf $OUT/call4.tgz -C /tmp/res .
