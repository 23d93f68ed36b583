#!/usr/bin/env bash
# call 5 of the eighteenth session: the targets on the final defaults (the one-pass fused merge on), the 0.6B
# at both contexts; then the 8B's target points with the fused merge's new blocks off side by side
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 290 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ablation-budget-s 30 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \|" /tmp/res/engine_bench.md | head -40; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call5a.tgz -C /tmp/res .
timeout 270 python3 bench/engine_bench.py --targets --shapes qwen3-8b --decode-bs 1,8 --extend-bs 4,16 --extend-q 2,4,8 --ablate fused_merge_passes=0 --ablation-budget-s 150 --out /tmp/res/engine8b > /tmp/res/engine8b.md 2> /tmp/res/engine8b.err; echo rc_8b=$?
grep -E "^\| (512|4096) \||fused_merge" /tmp/res/engine8b.md | head -50; tail -3 /tmp/res/engine8b.err
tar czf $OUT/call5.tgz -C /tmp/res .
