#!/usr/bin/env bash
# call 5 of the sixteenth session: how much of each step's PDL overlap comes from the early weight reads
# (dot_prefetch) and the attention's early KV reads (attn_prefetch), decode bs 1 / 4 and extends 1-4 x 8,
# the 32-row block on
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
TOKENROUTER_DOT_ROWS=32 timeout 280 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ctx 512 --decode-bs 1,4 --extend-bs 1,2,4 --extend-q 8 --ablate pdl,dot_prefetch,attn_prefetch --ablation-budget-s 140 --out /tmp/res/abl > /tmp/res/abl.md 2> /tmp/res/abl.err; echo rc=$?
grep -E "^\| (512|no )" /tmp/res/abl.md; tail -3 /tmp/res/abl.err
tar czf $OUT/call5.tgz -C /tmp/res .
