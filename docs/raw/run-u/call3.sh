#!/usr/bin/env bash
# call 3 of the twenty-first session: call 2 found the attention's KV tile (block_n 64 everywhere) and stage
# count far from the best at bs >= 4; sweep block_n x stages x warps at the engine's steps, both geometries
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
date +%s > /tmp/res/t0
P06=""; for c in 512 4096; do for b in 1 2 4 8 16 32 64; do P06="$P06${b}x1@$c,${b}x8@$c,"; done; P06="${P06}1x2@$c,4x2@$c,16x2@$c,"; done
timeout 330 python3 bench/attn_probe.py --sweep --points "$P06" --out /tmp/res/sweep06 > /tmp/res/sweep06.md 2> /tmp/res/sweep06.err; echo rc_06=$?
date +%s >> /tmp/res/t0
grep best /tmp/res/sweep06.md; tail -3 /tmp/res/sweep06.err
tar czf $OUT/call3.tgz -C /tmp/res .
P8=""; for c in 512 4096; do for b in 1 4 16 64; do P8="$P8${b}x1@$c,${b}x8@$c,"; done; done
timeout 200 python3 bench/attn_probe.py --sweep --heads 32 --points "$P8" --out /tmp/res/sweep8b > /tmp/res/sweep8b.md 2> /tmp/res/sweep8b.err; echo rc_8b=$?
date +%s >> /tmp/res/t0
grep best /tmp/res/sweep8b.md; tail -3 /tmp/res/sweep8b.err
tar czf $OUT/call3.tgz -C /tmp/res .
