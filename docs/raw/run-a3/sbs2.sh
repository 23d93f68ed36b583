#!/usr/bin/env bash
# Thirtieth session: a step's hops to one peer as one message (batch: .whl/batch.tgz = `git archive 898afc1`) side by side
# with one message per hop (each: .whl/each.tgz = `git archive 78a3fb9`, its parent; only messages.py and process.py differ).
# Usage: bash .whl/sbs2.sh CALLNAME TAG:VARIANT...
# Each part: 0.6B + 8B on one GPU, bernoulli p = 0.35, N = 8, 20 ms timeout, 48 requests x 512 tokens per row (--rounds 6):
# tuned by state (eager profile, 20-step minimum), eager, and the fixed (2, 6) and (2, 7).
set -u
call=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c-* /tmp/work; mkdir -p /tmp/res /tmp/c-each /tmp/c-batch
tar xzf .whl/each.tgz -C /tmp/c-each; tar xzf .whl/batch.tgz -C /tmp/c-batch
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
for spec in "$@"; do
  tag=${spec%%:*}; variant=${spec##*:}
  cd /tmp/c-$variant; export PYTHONPATH=/tmp/site:/tmp/c-$variant
  grep -c "PeerBatch" tokenrouter/runtime/subserver/process.py | sed "s/^/$tag $variant: PeerBatch mentions in process.py: /"
  timeout ${PART_S:-230} python3 bench/matrix.py --pair 0.6b+8b --policy bern0.35 --run tokenrouter:8 --run eager:8 --rounds 6 \
    --deadline-s $(( ${PART_S:-230} - 30 )) --max-delay-ms 20 --thresholds slm=2,llm=6 --thresholds slm=2,llm=7 \
    --tag $tag --out /tmp/res/$tag --work /tmp/work/$tag > /tmp/res/$tag.out 2>&1; echo rc_matrix_$tag=$?
  grep -E "tune N|fixed N|tok/s, tokens|warning|done in" /tmp/res/$tag.out
  grep -A12 "Where the time goes" /tmp/res/$tag.out | grep "^| [te]" | cut -d'|' -f2-5,9,15,16; grep -E "FAILED|SKIPPED" /tmp/res/$tag.out
done
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -300 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/$call.tgz -C /tmp/res .
