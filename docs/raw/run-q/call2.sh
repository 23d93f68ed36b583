#!/usr/bin/env bash
# call 2 of the seventeenth session: the 32-row down projection tuned alone (from call 1's table, register
# cap 128 too), the 16-row keys with register caps (objective 1x4,1x8), then the 0.6B targets with all of it
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
export TOKENROUTER_DOT_ROWS=32
TOKENROUTER_TUNED_TILES=.whl/s17tiles1.json timeout 170 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels dot_rows --objective 4x8 --start table --keys 1024x3072 --maxnreg 128 --deadline-s 90 --out /tmp/res/gt_down32 --table /tmp/res/t_down32.json > /tmp/res/gt_down32.md 2> /tmp/res/gt_down32.err; echo rc_down32=$?
grep -v "^$" /tmp/res/gt_down32.md | tail -16; tail -3 /tmp/res/gt_down32.err
timeout 160 python3 bench/graph_tune.py --shape qwen3-0.6b --kernels dot_rows --objective 1x4,1x8 --start table --maxnreg 128 --deadline-s 80 --out /tmp/res/gt16 --table /tmp/res/t16.json > /tmp/res/gt16.md 2> /tmp/res/gt16.err; echo rc_16=$?
grep -v "^$" /tmp/res/gt16.md | tail -22; tail -3 /tmp/res/gt16.err
python3 - <<'PY'
import json
from pathlib import Path
entries = {}
for p in ("tokenrouter/runtime/engine/attention/tuned_tiles.json", ".whl/s17tiles1.json", "/tmp/res/t_down32.json", "/tmp/res/t16.json"):
    if Path(p).exists():
        for e in json.loads(Path(p).read_text())["entries"]:
            entries[(e["gpu"], e["dtype"], json.dumps(e["key"], sort_keys=True))] = e
Path("/tmp/res/tiles_all.json").write_text(json.dumps(dict(entries=list(entries.values())), indent=1) + "\n")
for e in entries.values():
    print(e["key"]["N"], e["key"]["K"], e["key"]["BLOCK_X"], e["config"])
PY
TOKENROUTER_TUNED_TILES=/tmp/res/tiles_all.json timeout 250 python3 bench/engine_bench.py --targets --shapes qwen3-0.6b --ablation-budget-s 40 --out /tmp/res/engine > /tmp/res/engine_bench.md 2> /tmp/res/engine_bench.err; echo rc_bench=$?
grep -E "^\| (512|4096) \| (1|2|4|8|16) \||dot_rows_max=16|extend ≤|decode ≤" /tmp/res/engine_bench.md | head -70; tail -3 /tmp/res/engine_bench.err
tar czf $OUT/call2.tgz -C /tmp/res .
