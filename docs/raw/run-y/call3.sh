#!/usr/bin/env bash
# call 3 of the twenty-sixth session (run Y): is run 55 (p = 0.35, 20 ms timeout, B = (1, 5) 1.26x eager) repeatable?
# The same part twice (runs 56, 57), without the co-location profile, fixed (1, 5) and (1, 4) beside eager.
# Runs from `.whl/clean.tgz` (`git archive --format=tar.gz HEAD tokenrouter bench pyproject.toml`).
# Runs from `.whl/clean.tgz` (`git archive --format=tar.gz HEAD tokenrouter bench pyproject.toml`).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res /tmp/c; mkdir -p /tmp/res /tmp/c; tar xzf .whl/clean.tgz -C /tmp/c; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > /tmp/res/gpu.txt 2>&1
part() {  # tag policy max_delay_ms thresholds... ; the console's key lines after each part
  local tag=$1 pol=$2 delay=$3; shift 3
  local th=(); for t in "$@"; do th+=(--thresholds "$t"); done
  timeout 275 python3 bench/matrix.py --pair 0.6b+8b --policy $pol --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 235 \
    --max-delay-ms $delay "${th[@]}" \
    --tag $tag --out /tmp/res/$tag --work /tmp/work/$tag > /tmp/res/$tag.out 2>&1; echo rc_matrix_$tag=$?
  grep -E "co-location|tune N|fixed N|tok/s, tokens|warning" /tmp/res/$tag.out; grep -A8 "at each threshold" /tmp/res/$tag.out
  grep -A12 "Where the time goes" /tmp/res/$tag.out | grep "^| [te]"; grep -E "FAILED|SKIPPED" /tmp/res/$tag.out
}
part run56 bern0.35 20 slm=1,llm=5 slm=1,llm=4
part run57 bern0.35 20 slm=1,llm=5 slm=1,llm=4
grep -rh "stalled:" /tmp/work | head -10
mkdir -p /tmp/res/work-logs; find /tmp/work -name "*.stderr" -o -name "*.json" -size -2M | head -300 | xargs -I{} cp --parents {} /tmp/res/work-logs/ 2>/dev/null
tar czf $OUT/call3.tgz -C /tmp/res .
