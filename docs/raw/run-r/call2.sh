#!/usr/bin/env bash
# call 2 of the eighteenth session: the targets on the committed defaults at both contexts, then where
# a one-token decode and the bs-1 extends spend their kernel time (no PDL, so each kernel's time is its own)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 330 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ablation-budget-s 30 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \|" /tmp/res/engine_bench.md | head -40; tail -3 /tmp/res/engine_bench.err
TOKENROUTER_ENGINE_OFF=pdl timeout 150 python3 bench/engine_bench.py --shapes qwen3-0.6b --ctx 512 --decode-bs 1,4 --extend-bs 1 --extend-q 4,8 --no-hf --no-eager --no-ablation --profile --profile-cases 1x1@512,1x4@512,1x8@512 --out /tmp/res/prof_nopdl > /tmp/res/prof_nopdl.md 2> /tmp/res/prof_nopdl.err; echo rc_prof=$?
grep -E "^\| 512 \||kernels and|_kernel |nvjet" /tmp/res/prof_nopdl.md | head -40; tail -3 /tmp/res/prof_nopdl.err
tar czf $OUT/call2.tgz -C /tmp/res .
