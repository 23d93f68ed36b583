#!/usr/bin/env bash
# call 2 of the twentieth session: the new stage rule (extends pipelined; decodes pipelined above bs 16) on the
# 0.6B's targets, decode bs 4 and 16 included (fresh process, 2 passes), ablated against the old extend rule,
# the old decode rule, decodes pipelined from bs 9, every decode pipelined without the early reads, and the
# attention prefetch at extends of up to 4 tokens; then the 8B's points with the old rules side by side
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
date +%s > /tmp/res/t0
timeout 300 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --decode-bs 1,4,8,16,32,64 --passes 2 --ablate attn_extend_single_stage_rows=8,attn_decode_single_stage_bs=1000,attn_decode_single_stage_bs=8,attn_decode_single_stage_bs=0+attn_prefetch,attn_prefetch_max=4 --ablation-budget-s 170 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \||^\| (attn|no )|extend <=|skipped" /tmp/res/engine_bench.md | head -220; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call2a.tgz -C /tmp/res .
timeout 230 python3 bench/engine_bench.py --targets --shapes qwen3-8b --decode-bs 1,32 --extend-bs 4,16 --extend-q 2,8 --ablate attn_extend_single_stage_rows=8,attn_decode_single_stage_bs=1000 --ablation-budget-s 80 --out /tmp/res/engine8b > /tmp/res/engine8b.md 2> /tmp/res/engine8b.err; echo rc_8b=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \||^\| (attn|no )|extend <=|decode|skipped" /tmp/res/engine8b.md | head -90; tail -3 /tmp/res/engine8b.err
tar czf $OUT/call2.tgz -C /tmp/res .
