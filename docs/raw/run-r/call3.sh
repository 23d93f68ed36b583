#!/usr/bin/env bash
# call 3 of the eighteenth session (0de4ca7): the attention's split merge in the kernel for row blocks it
# merges in at most two passes (fused_merge_passes=2, wider passes), side by side with the merge launch
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 480 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ctx 512,4096 --decode-bs 4,16 --extend-bs 4,16 --extend-q 2,4,8 --ablate fused_merge_passes=2 --ablation-budget-s 300 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \||fused_merge" /tmp/res/engine_bench.md | head -40; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call3.tgz -C /tmp/res .
