#!/usr/bin/env bash
# call 2 of the twenty-first session: why an extend's attention at bs 16 grows with the context faster than
# a decode's (call 1: bs 16 x 8 from ctx 512 to 4096 +2.41 ms, decode bs 16 +1.84 ms, bs 4 alike): the kernel
# alone at the engine's launch options and variants, then the two steps' kernel times without PDL
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
date +%s > /tmp/res/t0
timeout 150 python3 bench/attn_probe.py --points 16x1@4096,16x2@4096,16x4@4096,16x8@4096,4x1@4096,4x8@4096,16x1@512,16x8@512,1x8@512 --variants zero_q,permuted,stages=1,stages=3,warps=8,block_n=32,block_n=128 --out /tmp/res/probe > /tmp/res/probe.md 2> /tmp/res/probe.err; echo rc_probe=$?
date +%s >> /tmp/res/t0
cat /tmp/res/probe.md; tail -3 /tmp/res/probe.err
tar czf $OUT/call2.tgz -C /tmp/res .
timeout 60 python3 bench/attn_probe.py --heads 32 --points 16x1@4096,16x8@4096,4x8@4096 --variants zero_q,stages=2,warps=8 --out /tmp/res/probe8b > /tmp/res/probe8b.md 2> /tmp/res/probe8b.err; echo rc_probe8b=$?
cat /tmp/res/probe8b.md; tail -3 /tmp/res/probe8b.err
tar czf $OUT/call2.tgz -C /tmp/res .
TOKENROUTER_ENGINE_OFF=pdl timeout 120 python3 bench/engine_bench.py --shapes qwen3-0.6b --ctx 512,4096 --decode-bs 16 --extend-bs 16 --extend-q 8 --no-hf --no-eager --no-ablation --profile-cases 16x1@4096,16x8@4096,16x1@512,16x8@512 --out /tmp/res/prof > /tmp/res/prof.md 2> /tmp/res/prof.err; echo rc_prof=$?
date +%s >> /tmp/res/t0
grep -E "kernels and|^ *(_|void|Memcpy|ampere|sm90|nvjet|cutlass|Self)" /tmp/res/prof.md | cut -c1-160 | head -80; tail -3 /tmp/res/prof.err
tar czf $OUT/call2.tgz -C /tmp/res .
