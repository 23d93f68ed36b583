#!/usr/bin/env bash
# Thirty-eighth session: .whl/part2.sh (docs/raw/run-a6/part2.sh) with the code archive named by ARCH (default clean.tgz).
# it fails, the part serves with TOKENROUTER_KERNEL_LOADS=0 and says so), and the servers' stall lines printed.
# From call 6 on it also prints the route kernel warm-up lines (RouteKernel.warm).
# Usage: PART_S=270 bash .whl/part2.sh CALLNAME TAG MATRIX-ARGS...
set -u
call=$1; tag=$2; shift 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c /tmp/work; mkdir -p /tmp/res /tmp/c; tar xzf .whl/${ARCH:-clean.tgz} -C /tmp/c; cp .whl/hookcheck.py /tmp/c/; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
python3 hookcheck.py > /tmp/res/hookcheck.txt 2>&1 || { export TOKENROUTER_KERNEL_LOADS=0; echo "hooks off" >> /tmp/res/hookcheck.txt; }
tail -3 /tmp/res/hookcheck.txt
timeout ${PART_S:-270} python3 bench/matrix.py "$@" --deadline-s $(( ${PART_S:-270} - 40 )) \
  --tag $tag --out /tmp/res/$tag --work /tmp/work/$tag > /tmp/res/$tag.out 2>&1; echo rc_matrix_$tag=$?
grep -E "] latencies|tune N|fixed N|tok/s, tokens|warning|done in|FAILED|SKIPPED" /tmp/res/$tag.out
grep -A12 "Where the time goes" /tmp/res/$tag.out | grep "^| [tel]"
grep -rh "stalled" /tmp/work | cut -c12-23,40- | head -20
grep -rh "route kernel warmed" /tmp/work | cut -c12-23,40- | head -8
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -300 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/$call.tgz -C /tmp/res .
