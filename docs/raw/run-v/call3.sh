#!/usr/bin/env bash
# call 3 of the twenty-second session (run V): TokenRouter against eager at N = 8 over a range of fixed
# delayed-batching thresholds (matrix.py --thresholds), each beside the tuned B and the DTMC's prediction:
# run 42, p = 0.35 (runs 39 / 41: B = (2, 2) 1.01x, (1, 3) 1.08-1.10x, the DTMC's top four within 1 %);
# run 43, p = 0.1 (runs 18 / 22 / 38 / 40: 0.98-1.03x)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 300 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.35 --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 280 \
  --thresholds llm=2 --thresholds slm=2,llm=2 --thresholds llm=4 --thresholds llm=5 --thresholds llm=6 --thresholds slm=2,llm=4 \
  --tag run42 --out /tmp/res/run42 --work /tmp/work > /tmp/res/run42.out 2>&1; echo rc_matrix_42=$?
grep -A12 "at each threshold" /tmp/res/run42.out; grep -E "FAILED|SKIPPED" /tmp/res/run42.out
timeout 265 python3 bench/matrix.py --pair 0.6b+8b --policy bern0.1 --run tokenrouter:8 --run eager:8 --rounds 5 --deadline-s 230 \
  --thresholds llm=2 --thresholds llm=3 --thresholds slm=2,llm=2 --thresholds slm=4,llm=1 \
  --tag run43 --out /tmp/res/run43 --work /tmp/work > /tmp/res/run43.out 2>&1; echo rc_matrix_43=$?
grep -A10 "at each threshold" /tmp/res/run43.out; grep -E "FAILED|SKIPPED" /tmp/res/run43.out
tar czf $OUT/call3.tgz -C /tmp/res .
