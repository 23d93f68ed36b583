#!/usr/bin/env bash
# call 2 of the nineteenth session (01812e4): the 0.6B's targets on the new defaults (the shipped 2-row GEMV
# tiles, dot_merge_unroll on), every extend point in 3 passes; dot_merge_unroll ablated (off) in the same
# process; then a second process, the same targets, no ablation (how much a point moves between processes)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
date +%s > /tmp/res/t0
timeout 280 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --passes 3 --ablate dot_merge_unroll --ablation-budget-s 90 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \||dot_merge_unroll|extend <=" /tmp/res/engine_bench.md | head -60; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call2a.tgz -C /tmp/res .
timeout 200 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --passes 3 --no-ablation --out /tmp/res/engine2 > /tmp/res/engine_bench2.md 2> /tmp/res/engine_bench2.err; echo rc_bench2=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \| (1|4|16) \| [248] \||extend <=" /tmp/res/engine_bench2.md | head -30; tail -3 /tmp/res/engine_bench2.err
tar czf $OUT/call2.tgz -C /tmp/res .
