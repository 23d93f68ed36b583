#!/usr/bin/env bash
# call 4 of the seventeenth session: dot_rows' folded add & RMSNorm (dot_rows_norm, opt-in) with tiles tuned
# for its keys (16-row block, objective 1x4,1x8), then its effect side by side at the 0.6B's target steps
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
TOKENROUTER_ENGINE_ON=dot_rows_norm timeout 150 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels dot_rows --objective 1x4,1x8 --keys 4096x1024,6144x1024 --tiles "32,256,4,4;64,256,4,4;32,1024,1,4;16,1024,1,8;32,512,2,8;64,512,2,8;16,256,4,4;32,256,4,8" --maxnreg 128 --deadline-s 85 --out /tmp/res/gt_norm --table /tmp/res/t_norm.json > /tmp/res/gt_norm.md 2> /tmp/res/gt_norm.err; echo rc_norm=$?
grep -v "^$" /tmp/res/gt_norm.md | tail -18; grep -v Warn /tmp/res/gt_norm.err | tail -3
[ -f /tmp/res/t_norm.json ] && export TOKENROUTER_TUNED_TILES=/tmp/res/t_norm.json
timeout 170 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ctx 512,4096 --decode-bs 1,4 --extend-bs 1,4 --extend-q 4,8 --ablate dot_rows_norm --ablation-budget-s 80 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \| (1|4) \||dot_rows_norm" /tmp/res/engine_bench.md | head -40; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call4.tgz -C /tmp/res .
