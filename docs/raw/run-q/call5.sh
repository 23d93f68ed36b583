#!/usr/bin/env bash
# call 5 of the seventeenth session: the 0.6B's ctx-512 targets with the committed defaults (32-row block for
# 17-32 token extends, run Q's tiles, folded norm on the 16-row block), no ablation
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 115 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ctx 512 --no-ablation --out $OUT/engine > $OUT/engine_bench.md 2> $OUT/engine_bench.err; echo rc_bench=$?
grep -E "^\| 512 \||extend ≤|decode ≤" $OUT/engine_bench.md | head -40; tail -3 $OUT/engine_bench.err
