#!/usr/bin/env bash
# call 6 of the eighteenth session: the one-token GEMV's tiles tuned inside the graph step (objective: the
# decode bs 1 at ctx 512), then the decode bs 1 and the bs 1 extend of 8 with that table, tuned_tiles off
# side by side (the autotuner's picks of this process)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 320 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels gemv --deadline-s 160 --out /tmp/res/gt_gemv --table /tmp/res/t_gemv.json > /tmp/res/gt_gemv.md 2> /tmp/res/gt_gemv.err; echo rc_tune=$?
grep -v "^$" /tmp/res/gt_gemv.md | tail -22; grep -v Warn /tmp/res/gt_gemv.err | tail -3
tar czf $OUT/call6a.tgz -C /tmp/res .
[ -f /tmp/res/t_gemv.json ] && export TOKENROUTER_TUNED_TILES=/tmp/res/t_gemv.json
timeout 170 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ctx 512,4096 --decode-bs 1 --extend-bs 1 --extend-q 8 --ablate tuned_tiles --ablation-budget-s 60 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \||tuned_tiles" /tmp/res/engine_bench.md | head -20; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call6.tgz -C /tmp/res .
