#!/usr/bin/env bash
# call 1 of the sixteenth session (7b5ac13): the 0.6B targets with the extends' split-merge ablation rows
# first (fused_merge_rows=16, extend_splits_max 8/4/1), then a PDL-off kernel profile of decode bs 4 and the
# bs 4 x 8 / bs 1 x 8 extends at ctx 512
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > /tmp/res/gpu.txt 2>&1
timeout 360 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ablation-budget-s 200 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \| 1 \||fused_merge_rows|extend_splits|extend ≤|decode ≤|target" /tmp/res/engine_bench.md | head -60; tail -3 /tmp/res/engine_bench.err
TOKENROUTER_ENGINE_OFF=pdl timeout 150 python3 bench/engine_bench.py --shapes qwen3-0.6b --ctx 512 --decode-bs 4 --extend-bs 1,4 --extend-q 8 --no-hf --no-eager --no-ablation --profile --profile-cases 4x1@512,4x8@512,1x8@512 --out /tmp/res/profile > /tmp/res/profile.md 2> /tmp/res/profile.err; echo rc_prof=$?
tail -3 /tmp/res/profile.err
tar czf $OUT/call1.tgz -C /tmp/res .
