#!/usr/bin/env bash
# call 1 of the eighteenth session: tiles for the 32-row block's folded add & RMSNorm keys (NORM, BLOCK_X 32),
# objective the bs-4 extend of 8 tokens with every dot_rows step folding; then, with that table, the fold at
# 17-32 token steps on (dot_rows_norm_max 32, the default the table then makes) against 16, side by side
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
TOKENROUTER_ENGINE_ON=dot_rows_norm timeout 330 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels dot_rows --objective 4x8 --start table --keys 4096x1024,6144x1024 --tiles "32,1024,1,4;64,256,4,4;32,512,2,4;32,256,4,4;64,512,2,8;16,1024,1,4;64,1024,1,8" --maxnreg 128 --deadline-s 230 --out /tmp/res/gt_norm32 --table /tmp/res/t_norm32.json > /tmp/res/gt_norm32.md 2> /tmp/res/gt_norm32.err; echo rc_tune=$?
grep -v "^$" /tmp/res/gt_norm32.md | tail -16; grep -v Warn /tmp/res/gt_norm32.err | tail -3
[ -f /tmp/res/t_norm32.json ] && export TOKENROUTER_TUNED_TILES=/tmp/res/t_norm32.json
timeout 200 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ctx 512,4096 --decode-bs 4,16 --extend-bs 4,16 --extend-q 2,8 --ablate dot_rows_norm_max=16 --ablation-budget-s 120 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \||dot_rows_norm" /tmp/res/engine_bench.md | head -40; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call1.tgz -C /tmp/res .
