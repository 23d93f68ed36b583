#!/usr/bin/env bash
# call 4 of the eighteenth session (0de4ca7): call 3 had the two-pass fused merge (bs 4 x 8) slower and the
# one-pass ones faster; here one pass everywhere it fits twice call 3's tile (FUSED_MERGE_TILE 16384 floats:
# bs 4 x 8's 16 rows x 8 splits at once), side by side with the merge launch
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
cat > /tmp/wide.py <<'PY'
import runpy, sys
import tokenrouter.runtime.engine.attention.triton_kernels as tk
tk.FUSED_MERGE_TILE = 16384
sys.argv = ["bench/engine_bench.py", *sys.argv[1:]]
runpy.run_path("bench/engine_bench.py", run_name="__main__")
PY
timeout 400 python3 /tmp/wide.py --targets --shapes qwen3-0.6b --ctx 512,4096 --decode-bs 4,16 --extend-bs 1,4,16 --extend-q 4,8 --ablate fused_merge_passes=1 --ablation-budget-s 300 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \||fused_merge" /tmp/res/engine_bench.md | head -40; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call4.tgz -C /tmp/res .
