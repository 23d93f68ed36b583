#!/usr/bin/env bash
# call 1 of the twenty-first session: run T's unrun call 3 (the committed decode rule at the 8B's decodes
# against the old rule, then the 0.6B's targets in a fresh process, decode bs 2 included), then a PDL
# timeline of the two missed extends (bs 1 x 8, bs 4 x 8 at ctx 512) beside decode bs 4 on the current code
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > /tmp/res/gpu.txt
date +%s > /tmp/res/t0
timeout 150 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --decode-bs 1,2,4,8,16,32,64 --passes 2 --ablate attn_decode_single_stage_bs=1 --ablation-budget-s 20 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \||^\| (attn|no )|extend <=|skipped" /tmp/res/engine_bench.md | head -90; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call1.tgz -C /tmp/res .
timeout 110 python3 bench/engine_bench.py --targets --shapes qwen3-8b --decode-bs 1,4,8,32 --extend-bs 4 --extend-q 2,8 --ablate attn_decode_single_stage_bs=1000 --ablation-budget-s 30 --out /tmp/res/engine8b > /tmp/res/engine8b.md 2> /tmp/res/engine8b.err; echo rc_8b=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \||^\| (attn|no )|extend <=|decode <=|skipped" /tmp/res/engine8b.md | head -60; tail -3 /tmp/res/engine8b.err
tar czf $OUT/call1.tgz -C /tmp/res .
timeout 100 python3 bench/pdl_timeline.py --shape qwen3-0.6b --ctx 512 --steps 4x1,1x8,4x8 --out /tmp/res/tl > /tmp/res/timeline.md 2> /tmp/res/timeline.err; echo rc_tl=$?
date +%s >> /tmp/res/t0
cat /tmp/res/timeline.md | head -80; tail -3 /tmp/res/timeline.err
tar czf $OUT/call1.tgz -C /tmp/res .
