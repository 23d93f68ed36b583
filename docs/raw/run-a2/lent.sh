#!/usr/bin/env bash
# Twenty-ninth session, last call: tune with the latencies alone lent by a second profile served at (2, 5)
# (`bench/matrix.py --alone-from slm=2,llm=5`, e56fa17), one part at p = 0.35, N = 8, 20 ms, 40 requests per row:
# the tuned row and eager only (the device time left was 284 s).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c /tmp/work; mkdir -p /tmp/res /tmp/c; tar xzf .whl/clean.tgz -C /tmp/c; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
tag=$1
timeout ${2:-170} python3 bench/matrix.py --pair 0.6b+8b --policy bern0.35 --run tokenrouter:8 --run eager:8 --rounds 5 \
  --deadline-s 140 --max-delay-ms 20 --alone-from slm=2,llm=5 --tag $tag --out /tmp/res/$tag --work /tmp/work/$tag > /tmp/res/$tag.out 2>&1
echo rc_matrix_$tag=$?
grep -E "latencies alone|tune N|tok/s, tokens|warning|done in|FAILED|SKIPPED" /tmp/res/$tag.out
grep -A12 "Where the time goes" /tmp/res/$tag.out | grep "^| [te]"
grep -h "alone from\|alone b=" /tmp/work/$tag/*/raw-*/tune.log | head -12
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -300 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/lent.tgz -C /tmp/res .
