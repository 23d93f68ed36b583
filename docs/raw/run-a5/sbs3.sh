#!/usr/bin/env bash
# Thirty-second session: lockstep and llm-only on c415b46 (old: .whl/old.tgz = `git archive c415b46`, run 40's code)
# side by side with HEAD (new: .whl/clean.tgz), each from its own archive with its own bench/matrix.py.
# Usage: PART_S=150 bash .whl/sbs3.sh CALLNAME TAG:VARIANT...   e.g. run93:old run94:new run95:old
# Each part: 0.6B + 8B on one GPU, bernoulli p = 0.1, N = 4, 24 requests x 512 tokens per mode (--rounds 6).
set -u
call=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c-* /tmp/work; mkdir -p /tmp/res /tmp/c-old /tmp/c-new
tar xzf .whl/old.tgz -C /tmp/c-old; tar xzf .whl/clean.tgz -C /tmp/c-new
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
for spec in "$@"; do
  tag=${spec%%:*}; variant=${spec##*:}
  cd /tmp/c-$variant; export PYTHONPATH=/tmp/site:/tmp/c-$variant
  grep -c "tokens_by_bs" tokenrouter/runtime/subserver/scheduler.py | sed "s/^/$tag $variant: tokens_by_bs mentions in scheduler.py: /"
  timeout ${PART_S:-150} python3 bench/matrix.py --pair 0.6b+8b --policy bern0.1 --run lockstep:4 --run llm-only:4 --rounds 6 \
    --deadline-s $(( ${PART_S:-150} - 30 )) --tag $tag --out /tmp/res/$tag --work /tmp/work/$tag > /tmp/res/$tag.out 2>&1
  echo rc_matrix_$tag=$?
  grep -E "tok/s, tokens|warning|done in|FAILED|SKIPPED" /tmp/res/$tag.out
  grep -A12 "Where the time goes" /tmp/res/$tag.out | grep "^| [l]"
done
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -300 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/$call.tgz -C /tmp/res .
