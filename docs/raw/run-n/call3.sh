#!/usr/bin/env bash
# call 3 of the fourteenth session: the route kernels' gpu-marked tests on HEAD, then which engine_gpu test ran past call 2's limit
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 280 python3 -m pytest -v -m gpu tests/kernels -p no:cacheprovider --durations=0 > /tmp/res/pytest_gpu_kernels.txt 2>&1; echo rc_kernels=$?
grep -E "PASSED|FAILED|ERROR|passed|failed" /tmp/res/pytest_gpu_kernels.txt | tail -14
timeout 130 python3 -m pytest -v -s -m gpu tests/engine_gpu/test_engine_paths.py -p no:cacheprovider --durations=0 > /tmp/res/pytest_gpu_paths.txt 2>&1; echo rc_paths=$?
grep -E "PASSED|FAILED|ERROR|passed|failed|::" /tmp/res/pytest_gpu_paths.txt | tail -6
tar czf $OUT/call3.tgz -C /tmp/res .
