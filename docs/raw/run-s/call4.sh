#!/usr/bin/env bash
# call 4 of the nineteenth session (6b26598): (a) the same graphs timed first, after a second runner's capture,
# and after it is dropped (bench/step_partner.py, built as engine_bench --targets builds), SM clock and power
# sampled alongside; (b) the 32-row block's dot_rows tiles tuned again from the shipped table now that the
# split merge is unrolled (objective bs 4 x 8), and the targets with that table
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
date +%s > /tmp/res/t0
(nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 100 > /tmp/res/smi.csv 2>&1 &) ; sleep 1
timeout 200 python3 bench/step_partner.py --out /tmp/res/partner > /tmp/res/partner.md 2> /tmp/res/partner.err; echo rc=$?
pkill -f "nvidia-smi --query" ; cat /tmp/res/partner.md; grep -v Warn /tmp/res/partner.err | tail -3
awk -F, 'NR>1{print $2}' /tmp/res/smi.csv | sort | uniq -c | sort -rn | head -3
date +%s >> /tmp/res/t0
tar czf $OUT/call4a.tgz -C /tmp/res .
timeout 240 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels dot_rows --objective 4x8 --start table --maxnreg 128 --deadline-s 150 --out /tmp/res/gt32 --table /tmp/res/t32.json > /tmp/res/gt32.md 2> /tmp/res/gt32.err; echo rc_gt=$?
grep -v "^$" /tmp/res/gt32.md | tail -14; grep -v Warn /tmp/res/gt32.err | tail -3
date +%s >> /tmp/res/t0
tar czf $OUT/call4b.tgz -C /tmp/res .
[ -f /tmp/res/t32.json ] && TOKENROUTER_TUNED_TILES=/tmp/res/t32.json timeout 130 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ctx 512,4096 --passes 2 --no-ablation --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \| (1|4|16) \| [248] \||extend <=" /tmp/res/engine_bench.md | head -30; tail -2 /tmp/res/engine_bench.err
date +%s >> /tmp/res/t0
tar czf $OUT/call4.tgz -C /tmp/res .
