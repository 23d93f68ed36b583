#!/usr/bin/env bash
# call 3 of the twentieth session: the decode rule from call 2 (decodes of up to 2 requests read early, one
# stage; larger ones pipelined without early reads) at the 8B's decodes against the old rule (every decode
# early, one stage), then the 0.6B's targets in a fresh process (decode bs 2 included) and bs 2 pipelined
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
date +%s > /tmp/res/t0
timeout 110 python3 bench/engine_bench.py --targets --shapes qwen3-8b --decode-bs 1,4,8,32 --extend-bs 4 --extend-q 2,8 --ablate attn_decode_single_stage_bs=1000 --ablation-budget-s 30 --out /tmp/res/engine8b > /tmp/res/engine8b.md 2> /tmp/res/engine8b.err; echo rc_8b=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \||^\| (attn|no )|extend <=|decode <=|skipped" /tmp/res/engine8b.md | head -60; tail -3 /tmp/res/engine8b.err
tar czf $OUT/call3a.tgz -C /tmp/res .
timeout 150 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --decode-bs 1,2,4,8,16,32,64 --passes 2 --ablate attn_decode_single_stage_bs=1 --ablation-budget-s 20 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \||^\| (attn|no )|extend <=|skipped" /tmp/res/engine_bench.md | head -90; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call3.tgz -C /tmp/res .
