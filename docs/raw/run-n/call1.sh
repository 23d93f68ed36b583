#!/usr/bin/env bash
# call 1 of the fourteenth session: every gpu-marked test on HEAD (route kernels' compiled variants and offset rows included), and the route benchmark once more
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
git log --oneline -1 2>/dev/null | cat
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 380 python3 -m pytest -q -m gpu tests --ignore=tests/runtime/frontend -p no:cacheprovider --durations=15 > /tmp/res/pytest_gpu.txt 2>&1; echo rc_pytest=$?
grep -E "passed|failed|error" /tmp/res/pytest_gpu.txt | tail -5
timeout 90 python3 bench/route_kernel_bench.py --no-v1 --no-torch --json /tmp/res/route.json --md /tmp/res/route.md > /tmp/res/route.log 2>&1; echo rc_bench=$?
grep "^| 64 " /tmp/res/route.md | cut -d'|' -f2-7
tar czf $OUT/call1.tgz -C /tmp/res .
