#!/usr/bin/env bash
# call 4 of the nineteenth session: the same graphs timed first, after a second runner's capture, and after it
# is dropped (bench/step_partner.py, built as engine_bench --targets builds), SM clock and power sampled alongside
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
(nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 100 > /tmp/res/smi.csv 2>&1 &) ; sleep 1
timeout 400 python3 bench/step_partner.py --out /tmp/res/partner > /tmp/res/partner.md 2> /tmp/res/partner.err; echo rc=$?
pkill -f "nvidia-smi --query" ; cat /tmp/res/partner.md; grep -v Warn /tmp/res/partner.err | tail -3
awk -F, 'NR>1{print $2}' /tmp/res/smi.csv | sort | uniq -c | sort -rn | head -5
tar czf $OUT/call4.tgz -C /tmp/res .
