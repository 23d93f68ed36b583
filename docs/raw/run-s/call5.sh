#!/usr/bin/env bash
# call 5 of the nineteenth session: what moves an engine's already-captured graphs between two speeds
# (bench/step_partner.py: timed first, after 4 GiB taken and freed, after eager steps, after a second runner's
# capture, after it is dropped), SM clock sampled alongside
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
(nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 100 > /tmp/res/smi.csv 2>&1 &) ; sleep 1
timeout 300 python3 bench/step_partner.py --points 1x4,1x8,4x8,16x4 --decode-bs 1,4,32 --out /tmp/res/partner > /tmp/res/partner.md 2> /tmp/res/partner.err; echo rc=$?
pkill -f "nvidia-smi --query" ; cat /tmp/res/partner.md; grep -v Warn /tmp/res/partner.err | tail -3
awk -F, 'NR>1{print $2}' /tmp/res/smi.csv | sort | uniq -c | sort -rn | head -3
tar czf $OUT/call5.tgz -C /tmp/res .
