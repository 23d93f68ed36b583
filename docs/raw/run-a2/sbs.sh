#!/usr/bin/env bash
# Twenty-ninth session: the one-loop subserver side by side with the subserver's two IO threads, in one call.
# Usage: bash .whl/sbs.sh CALLNAME TAG:VARIANT...  with VARIANT `loop` (.whl/clean.tgz: `git archive 59636d7`)
# or `threads` (.whl/threads.tgz: 59636d7 with be968e9 reverted, commit 2d2068b: only ipc.py and process.py differ).
# The tuning profile keeps batch sizes of at least 20 steps (59636d7: profile --min-steps 20).
# Each part: 0.6B + 8B on one GPU, bernoulli p = 0.35, N = 8, 20 ms timeout, 64 requests x 512 tokens per row:
# tuned by state, eager, and the fixed (2, 5) (or $FIXED, e.g. FIXED=slm=2,llm=6).
set -u
call=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c-* /tmp/work; mkdir -p /tmp/res /tmp/c-loop /tmp/c-threads
tar xzf .whl/clean.tgz -C /tmp/c-loop; tar xzf .whl/threads.tgz -C /tmp/c-threads
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
for spec in "$@"; do
  tag=${spec%%:*}; variant=${spec##*:}
  cd /tmp/c-$variant; export PYTHONPATH=/tmp/site:/tmp/c-$variant
  grep -c "_client_loop\|inter_model" tokenrouter/runtime/subserver/process.py | sed "s/^/$tag $variant: IO-thread mentions in process.py: /"
  timeout 260 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.35 --run tokenrouter:8 --run eager:8 --rounds 8 --deadline-s 230 \
    --max-delay-ms 20 --thresholds ${FIXED:-slm=2,llm=5} \
    --tag $tag --out /tmp/res/$tag --work /tmp/work/$tag > /tmp/res/$tag.out 2>&1; echo rc_matrix_$tag=$?
  grep -E "co-location|tune N|fixed N|tok/s, tokens|warning|done in" /tmp/res/$tag.out; grep -A6 "at each threshold" /tmp/res/$tag.out
  grep -A12 "Where the time goes" /tmp/res/$tag.out | grep "^| [te]"; grep -E "FAILED|SKIPPED" /tmp/res/$tag.out
done
grep -rh "stalled:" /tmp/work | head -10
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -300 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/$call.tgz -C /tmp/res .
