#!/usr/bin/env bash
# call 3 of the nineteenth session: what an extend graph's measured time depends on (bench/step_partner.py),
# with the GPU's SM clock and power sampled every 100 ms alongside
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
(nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 100 > /tmp/res/smi.csv 2>&1 &) ; sleep 1
timeout 300 python3 bench/step_partner.py --points 1x2,1x4,1x8,4x8,16x4 --ctx 512 --out /tmp/res/partner > /tmp/res/partner.md 2> /tmp/res/partner.err; echo rc=$?
pkill -f "nvidia-smi --query" ; cat /tmp/res/partner.md; grep -v Warn /tmp/res/partner.err | tail -3
wc -l /tmp/res/smi.csv; head -3 /tmp/res/smi.csv; awk -F, 'NR>1{print $2}' /tmp/res/smi.csv | sort | uniq -c | sort -rn | head -5
tar czf $OUT/call3.tgz -C /tmp/res .
