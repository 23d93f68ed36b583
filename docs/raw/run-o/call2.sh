#!/usr/bin/env bash
# call 2 of the fifteenth session: dot_rows tile configs chosen inside the graph step (0.6B, bs-1 extends)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
git log --oneline -1 > /tmp/res/head.txt 2>&1
timeout 560 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels dot_rows --deadline-s 440 --out /tmp/res/graph_tune > /tmp/res/graph_tune.md 2> /tmp/res/graph_tune.err; echo rc_tune=$?
cat /tmp/res/graph_tune.md; tail -5 /tmp/res/graph_tune.err
tar czf $OUT/call2.tgz -C /tmp/res .
