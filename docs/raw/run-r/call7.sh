#!/usr/bin/env bash
# call 7 of the eighteenth session (5301779): the targets on the final defaults (the shipped table's GEMV
# tiles, the one-pass fused merge), the 0.6B at both contexts, no ablation (the device budget's last minutes)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 200 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --no-ablation --out $OUT/engine > $OUT/engine_bench.md 2> $OUT/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \|" $OUT/engine_bench.md | head -40; tail -3 $OUT/engine_bench.err
