#!/usr/bin/env bash
# call 3 of the fifteenth session: the 0.6B targets with the graph-tuned dot_rows tiles (ablation: tuned_tiles
# off first), then graph_tune with ctx 4096 as the objective
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
git log --oneline -1 > /tmp/res/head.txt 2>&1
timeout 300 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ablation-budget-s 70 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \| 1 \||no tuned_tiles|extend ≤|decode ≤|target" /tmp/res/engine_bench.md | head -40; tail -3 /tmp/res/engine_bench.err
timeout 240 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels dot_rows --ctx 4096 --deadline-s 200 --out /tmp/res/graph_tune4096 --table /tmp/res/tiles4096.json > /tmp/res/graph_tune4096.md 2> /tmp/res/graph_tune4096.err; echo rc_tune=$?
cat /tmp/res/graph_tune4096.md; tail -3 /tmp/res/graph_tune4096.err
tar czf $OUT/call3.tgz -C /tmp/res .
