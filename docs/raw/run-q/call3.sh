#!/usr/bin/env bash
# call 3 of the seventeenth session: the 32-row down projection tuned over wider tiles (from the shipped
# table, cap 128 too), then the 0.6B targets with the engine's new defaults (17-32 token extends on the
# 32-row block) and that table, then the timeline of decode bs 4 and extend 4 x 8
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 180 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels dot_rows --objective 4x8 --start table --keys 1024x3072 --tiles "64,256,12,4;64,256,12,8;128,256,12,8;64,512,6,8;32,512,6,8" --maxnreg 128 --deadline-s 100 --out /tmp/res/gt_down --table /tmp/res/t_down.json > /tmp/res/gt_down.md 2> /tmp/res/gt_down.err; echo rc_down=$?
grep -v "^$" /tmp/res/gt_down.md | tail -16; grep -v Warn /tmp/res/gt_down.err | tail -3
[ -f /tmp/res/t_down.json ] && export TOKENROUTER_TUNED_TILES=/tmp/res/t_down.json
timeout 250 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ablation-budget-s 30 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \| (1|2|4|8|16) \||dot_rows_max=16|extend ≤|decode ≤" /tmp/res/engine_bench.md | head -70; tail -3 /tmp/res/engine_bench.err
timeout 90 python3 bench/pdl_timeline.py --shape qwen3-0.6b --ctx 512 --steps 4x1,4x8 --replays 3 --out /tmp/res/tl > /tmp/res/tl.md 2> /tmp/res/tl.err; echo rc_tl=$?
cat /tmp/res/tl.md; tail -3 /tmp/res/tl.err
tar czf $OUT/call3.tgz -C /tmp/res .
