#!/usr/bin/env bash
# call 4 of the fourteenth session: the route kernels' gpu-marked tests compiled for real (call 3 found them interpreted), then where call 2's time went
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 200 python3 -m pytest -v -m gpu tests/kernels -p no:cacheprovider --durations=0 > /tmp/res/pytest_gpu_kernels.txt 2>&1; echo rc_kernels=$?
grep -E "PASSED|FAILED|ERROR|passed|failed" /tmp/res/pytest_gpu_kernels.txt | tail -12
grep -h "^OK" -r /tmp/res/pytest_gpu_kernels.txt | head
timeout 80 python3 -m pytest -v -m gpu tests/engine/test_engine_gpu.py tests/engine_gpu/test_triton_kernels.py -p no:cacheprovider --durations=0 > /tmp/res/pytest_gpu_engine.txt 2>&1; echo rc_engine=$?
grep -E "PASSED|FAILED|ERROR|passed|failed" /tmp/res/pytest_gpu_engine.txt | tail -14
tar czf $OUT/call4.tgz -C /tmp/res .
