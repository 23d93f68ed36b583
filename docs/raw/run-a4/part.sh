#!/usr/bin/env bash
# Thirty-first session: one matrix part with the arguments given, from .whl/clean.tgz, under `timeout $PART_S`.
# Usage: PART_S=270 bash .whl/part.sh CALLNAME TAG MATRIX-ARGS...
set -u
call=$1; tag=$2; shift 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c /tmp/work; mkdir -p /tmp/res /tmp/c; tar xzf .whl/clean.tgz -C /tmp/c; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
timeout ${PART_S:-270} python3 bench/matrix.py "$@" --deadline-s $(( ${PART_S:-270} - 40 )) \
  --tag $tag --out /tmp/res/$tag --work /tmp/work/$tag > /tmp/res/$tag.out 2>&1; echo rc_matrix_$tag=$?
grep -E "tune N|tok/s, tokens|warning|done in|FAILED|SKIPPED" /tmp/res/$tag.out
grep -A12 "Where the time goes" /tmp/res/$tag.out | grep "^| [tel]"
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -300 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/$call.tgz -C /tmp/res .
