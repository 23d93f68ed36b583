#!/usr/bin/env bash
# call 2 of the twenty-second session (run V): matrix runs 41a/41b, bernoulli p = 0.35, TokenRouter against eager
# at N = 8, twice in one call on one machine (each with its own tuning on serving metrics), to tell the tuner's
# choice from the server-start spread (run 39 read 1.01x, run 21 1.14x)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
(which nsys ncu; ls /usr/local/cuda*/bin 2>/dev/null | grep -E "nsys|ncu") > /tmp/res/tools.txt 2>&1; cat /tmp/res/tools.txt
for t in a b; do
  timeout 270 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.35 --run tokenrouter:8 --run eager:8 --rounds 6 --deadline-s 250 --tag run41$t --out /tmp/res/run41$t --work /tmp/work > /tmp/res/run41$t.out 2>&1; echo rc_matrix_$t=$?
  tail -30 /tmp/res/run41$t.out
done
tar czf $OUT/call2.tgz -C /tmp/res .
