#!/usr/bin/env bash
# Thirty-first session: the tuner on the eager profile merged with a second profile served at (2, 5) (--served-from),
# beside fixed thresholds, 0.6B + 8B on one GPU, bernoulli p = 0.35, N = 8, 20 ms timeout, 64 requests x 512 tokens per row.
# Usage: bash .whl/lent3.sh CALLNAME TAG:FIXED[+FIXED]...   e.g. run85:slm=2,llm=6  run87:slm=2,llm=6+slm=3,llm=6+slm=2,llm=7
set -u
call=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c /tmp/work; mkdir -p /tmp/res /tmp/c; tar xzf .whl/clean.tgz -C /tmp/c; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
for spec in "$@"; do
  tag=${spec%%:*}; fixed=${spec#*:}; targs=""
  for f in ${fixed//+/ }; do targs="$targs --thresholds $f"; done
  timeout ${PART_S:-270} python3 bench/matrix.py --pair 0.6b+8b --policy bern0.35 --run tokenrouter:8 --run eager:8 --rounds 8 \
    --deadline-s $(( ${PART_S:-270} - 30 )) --max-delay-ms 20 --served-from slm=2,llm=5 $targs \
    --tag $tag --out /tmp/res/$tag --work /tmp/work/$tag > /tmp/res/$tag.out 2>&1; echo rc_matrix_$tag=$?
  grep -E "] latencies|tune N|fixed N|tok/s, tokens|warning|done in" /tmp/res/$tag.out
  grep -A12 "Where the time goes" /tmp/res/$tag.out | grep "^| [te]"; grep -E "FAILED|SKIPPED" /tmp/res/$tag.out
done
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -300 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/$call.tgz -C /tmp/res .
