#!/usr/bin/env bash
# call 1 of the fifteenth session: engine start times (cold / retune / warm autotune cache), then the route
# kernel's last compiled launch variant (prefetch 2, the other sampler) that run N left
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
git log --oneline -1 > /tmp/res/head.txt 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > /tmp/res/gpu.txt 2>&1
timeout 420 python3 bench/startup_bench.py --shapes qwen3-0.6b,qwen3-8b --out /tmp/res/startup --work /tmp/sbwork > /tmp/res/startup.md 2> /tmp/res/startup.err; echo rc_startup=$?
cat /tmp/res/startup.md; tail -5 /tmp/res/startup.err
timeout 130 python3 -m pytest -o addopts="" -v -p no:cacheprovider "tests/kernels/test_route_triton_variants.py::test_compiled_variant_matches_plain_loop_bitwise[2-0-cdf]" > /tmp/res/variant_cdf.txt 2>&1; echo rc_variant=$?
tail -4 /tmp/res/variant_cdf.txt
tar czf $OUT/call1.tgz -C /tmp/res .
