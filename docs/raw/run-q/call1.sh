#!/usr/bin/env bash
# call 1 of the seventeenth session (see git log): the PDL timeline of the 0.6B's decode bs 4 and extends
# 1/2/4 x 8 (32-row block on), then graph_tune of the 32-row keys from the shipped table with register
# caps, then the timeline again with the tuned table
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
export TOKENROUTER_DOT_ROWS=32
timeout 150 python3 bench/pdl_timeline.py --shape qwen3-0.6b --ctx 512 --steps 4x1,1x8,2x8,4x8 --out /tmp/res/tl0 > /tmp/res/tl0.md 2> /tmp/res/tl0.err; echo rc_tl0=$?
cat /tmp/res/tl0.md; tail -5 /tmp/res/tl0.err
timeout 280 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels dot_rows --objective 4x8 --start table --maxnreg 128,168 --deadline-s 190 --out /tmp/res/gt --table /tmp/res/tiles_cap.json > /tmp/res/gt.md 2> /tmp/res/gt.err; echo rc_gt=$?
grep -v "^$" /tmp/res/gt.md | tail -22; tail -3 /tmp/res/gt.err
if [ -f /tmp/res/tiles_cap.json ]; then
  TOKENROUTER_TUNED_TILES=/tmp/res/tiles_cap.json timeout 100 python3 bench/pdl_timeline.py --shape qwen3-0.6b --ctx 512 --steps 4x1,4x8 --out /tmp/res/tl1 > /tmp/res/tl1.md 2> /tmp/res/tl1.err; echo rc_tl1=$?
  cat /tmp/res/tl1.md; tail -3 /tmp/res/tl1.err
fi
tar czf $OUT/call1.tgz -C /tmp/res .
