#!/usr/bin/env bash
# call 1 of the twentieth session: the 0.6B's targets on the committed defaults (fresh process, 2 passes), then
# ablation rows at every target point: extends of rows <= 8 pipelined (attn_single_stage_rows=2: run S's bs 16 x 4
# extend at ctx 4096, rows 8 and 1 stage, took 5.23 ms against 4.09 for 16 x 8), the extends' split fill at 90 %,
# the attention prefetch at extends too, and 2 stages for the decodes as well
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
date +%s > /tmp/res/t0
timeout 520 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --passes 2 --ablate attn_single_stage_rows=2,extend_split_fill=90,attn_prefetch_max=8,attn_single_stage_rows=0 --ablation-budget-s 330 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
date +%s >> /tmp/res/t0
grep -E "^\| (512|4096) \||^\| (attn|extend|no )|extend <=|skipped" /tmp/res/engine_bench.md | head -150; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call1.tgz -C /tmp/res .
