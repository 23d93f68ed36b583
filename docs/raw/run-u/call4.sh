#!/usr/bin/env bash
# call 4 of the twenty-first session: the committed KV-tile rule and decode rule (bs 1 only reads early) in the
# engine's steps: the targets in a fresh process, the tiles off side by side at every point; the 8B alike
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
date +%s > /tmp/res/t0
timeout 220 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --decode-bs 1,2,4,8,16,32,64 --passes 2 --ablate attn_tiles --ablation-budget-s 80 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \||^\| (attn|no )|extend <=|skipped" /tmp/res/engine_bench.md | head -90; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call4.tgz -C /tmp/res .
timeout 120 python3 bench/engine_bench.py --targets --shapes qwen3-8b --decode-bs 1,4,16,32 --extend-bs 4,16 --extend-q 2,8 --ablate attn_tiles --ablation-budget-s 40 --out /tmp/res/engine8b > /tmp/res/engine8b.md 2> /tmp/res/engine8b.err; echo rc_8b=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \||^\| (attn|no )|extend <=|decode <=|skipped" /tmp/res/engine8b.md | head -60; tail -3 /tmp/res/engine8b.err
tar czf $OUT/call4.tgz -C /tmp/res .
