#!/usr/bin/env bash
# call 1 of the twenty-second session (run V): matrix run 40, the p = 0.1 target modes (run 38's part and rounds)
# on runs T and U's engine (pipelined decodes without early reads from bs 2, 128-token KV tiles at 8-32 rows)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > /tmp/res/gpu.txt 2>&1
timeout 560 python3 bench/matrix.py --part 8b-bern0.1-targets --rounds 6 --deadline-s 480 --out /tmp/res/run40 --work /tmp/work > /tmp/res/run40.out 2>&1; echo rc_matrix=$?
tail -60 /tmp/res/run40.out
tar czf $OUT/call1.tgz -C /tmp/res .
