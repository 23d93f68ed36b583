#!/usr/bin/env bash
# call 2 of the sixteenth session (09f3d6b): dot_rows' 32-row block tuned inside the graph on the bs 4 x 8
# extend, then the 0.6B targets with it on (TOKENROUTER_DOT_ROWS=32 + the tuned table), the ablation's first
# row timing those steps on cuBLAS side by side
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 300 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels dot_rows --objective 4x8 --deadline-s 170 --out /tmp/res/gt32 --table /tmp/res/tiles32.json > /tmp/res/graph_tune32.md 2> /tmp/res/graph_tune32.err; echo rc_tune=$?
cat /tmp/res/graph_tune32.md | grep -v "^$" | tail -25; tail -3 /tmp/res/graph_tune32.err
[ -f /tmp/res/tiles32.json ] && export TOKENROUTER_TUNED_TILES=/tmp/res/tiles32.json
TOKENROUTER_DOT_ROWS=32 timeout 250 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ablation-budget-s 30 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \| (1|4|16) \||dot_rows_max=16|extend ≤|decode ≤" /tmp/res/engine_bench.md | head -60; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call2.tgz -C /tmp/res .
