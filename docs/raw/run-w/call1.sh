#!/usr/bin/env bash
# call 1 of the twenty-fourth session (run W): the tuner with the co-location term (`--colocation llm=3`:
# the served profile again at B_llm = 3, `profile --colocation`), against eager and the plain tuner's usual
# choice, N = 8: p = 0.1 (run 45) and p = 0.35 (run 46). The twenty-third session ran this same script once;
# its results were lost with that session, so these are the runs of record.
# Runs from `.whl/clean.tar` (`git archive HEAD tokenrouter bench pyproject.toml`), so that uncommitted edits
# in the working tree do not travel into the measurement.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c; mkdir -p /tmp/res /tmp/c; tar xf .whl/clean.tar -C /tmp/c; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
timeout 285 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.1 --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 250 \
  --colocation llm=3 --thresholds slm=1,llm=1 \
  --tag run45 --out /tmp/res/run45 --work /tmp/work > /tmp/res/run45.out 2>&1; echo rc_matrix_45=$?
grep -E "co-location|tune N" /tmp/res/run45.out; grep -A6 "at each threshold" /tmp/res/run45.out; grep -E "FAILED|SKIPPED" /tmp/res/run45.out
timeout 260 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.35 --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 225 \
  --colocation llm=3 --thresholds slm=2,llm=2 \
  --tag run46 --out /tmp/res/run46 --work /tmp/work > /tmp/res/run46.out 2>&1; echo rc_matrix_46=$?
grep -E "co-location|tune N" /tmp/res/run46.out; grep -A6 "at each threshold" /tmp/res/run46.out; grep -E "FAILED|SKIPPED" /tmp/res/run46.out
grep -rh "stall" /tmp/work | head -20
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -200 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/call1.tgz -C /tmp/res .
