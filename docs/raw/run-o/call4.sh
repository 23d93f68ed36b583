#!/usr/bin/env bash
# call 4 of the fifteenth session: the 0.6B targets with dot_rows up to 32 tokens (ablation: tuned_tiles off,
# dot_rows off, dot_rows_max=16), then the compiled dot_rows tests at 17 and 32 rows
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 330 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ablation-budget-s 80 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \| (1|4|16) \||dot_rows_max=16|extend <=|decode <=" /tmp/res/engine_bench.md | head -60; tail -3 /tmp/res/engine_bench.err
timeout 150 python3 -m pytest -o addopts="" -q -p no:cacheprovider tests/engine_gpu/test_fused_ops.py -k "test_dot_rows and (-17] or -32] or -27])" > /tmp/res/pytest_dot32.txt 2>&1; echo rc_pytest=$?
tail -4 /tmp/res/pytest_dot32.txt
tar czf $OUT/call4.tgz -C /tmp/res .
