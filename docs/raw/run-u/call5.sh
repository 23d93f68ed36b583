#!/usr/bin/env bash
# call 5 of the twenty-first session: the 0.6B's targets in a fresh process with bs 4 back on the 64-token KV tile
# (ATTN_WIDE_TILE_SPLITS 4: call 4 measured the 128-token tile 0.91x at bs 4 x 8, ctx 512), no ablation
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 140 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --decode-bs 1,4,8,16 --no-ablation --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \||extend <=|decode <=" /tmp/res/engine_bench.md | head -40; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call5.tgz -C /tmp/res .
