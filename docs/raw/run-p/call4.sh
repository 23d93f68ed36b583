#!/usr/bin/env bash
# call 4 of the sixteenth session (62d2a37): (1) matrix run 39, bernoulli p = 0.35, TokenRouter against eager
# at N = 8 with run O's engine; (2) kernel profile without PDL of the bs 4 x 8 extend on dot_rows' 32-row block
# (tiles of run P) next to 2 x 8 (16-row block), 1 x 8 and decode bs 4, and the same steps' times with PDL
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/c /tmp/res && tar xf .whl/clean.tar -C /tmp/c
( cd /tmp/c && PYTHONPATH=/tmp/site:/tmp/c timeout 300 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.35 --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 280 --out /tmp/res/run39 --work /tmp/work > /tmp/res/run39.out 2>&1; echo rc_matrix=$? )
tail -45 /tmp/res/run39.out
export PYTHONPATH=/tmp/site:$PWD
ARGS="--shapes qwen3-0.6b --ctx 512 --decode-bs 4 --extend-bs 1,2,4 --extend-q 8 --no-hf --no-eager --no-ablation"
TOKENROUTER_DOT_ROWS=32 TOKENROUTER_ENGINE_OFF=pdl timeout 150 python3 bench/engine_bench.py $ARGS --profile --profile-cases 4x1@512,4x8@512,2x8@512,1x8@512 --out /tmp/res/prof_nopdl > /tmp/res/prof_nopdl.md 2> /tmp/res/prof_nopdl.err; echo rc_prof=$?
TOKENROUTER_DOT_ROWS=32 timeout 100 python3 bench/engine_bench.py $ARGS --no-profile --out /tmp/res/pdl > /tmp/res/pdl.md 2> /tmp/res/pdl.err; echo rc_pdl=$?
grep -E "^\| 512 \|" /tmp/res/prof_nopdl.md /tmp/res/pdl.md; grep -E "kernels and|_dot_rows_kernel|_paged_attn|_merge" /tmp/res/prof_nopdl.md
tar czf $OUT/call4.tgz -C /tmp/res .
