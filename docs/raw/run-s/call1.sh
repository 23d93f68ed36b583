#!/usr/bin/env bash
# call 1 of the nineteenth session (66baf3a): the few-row GEMV's tiles tuned inside the graph step (objective:
# the bs 1 extend of 2 tokens, ctx 512), then the 0.6B's targets with that table, dot_merge_unroll ablated
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
date +%s > /tmp/res/t0
timeout 215 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels gemv_rows --objective 1x2 --deadline-s 110 --out /tmp/res/gt_rows --table /tmp/res/t_rows.json > /tmp/res/gt_rows.md 2> /tmp/res/gt_rows.err; echo rc_tune=$?
date +%s >> /tmp/res/t0
grep -v "^$" /tmp/res/gt_rows.md | tail -16; grep -v Warn /tmp/res/gt_rows.err | tail -3
tar czf $OUT/call1a.tgz -C /tmp/res .
[ -f /tmp/res/t_rows.json ] && export TOKENROUTER_TUNED_TILES=/tmp/res/t_rows.json
timeout 330 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ablate dot_merge_unroll --ablation-budget-s 100 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \||dot_merge_unroll" /tmp/res/engine_bench.md | head -40; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call1.tgz -C /tmp/res .
