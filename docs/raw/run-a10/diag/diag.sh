#!/usr/bin/env bash
# Thirty-seventh session: why does the eager warm-up take 54-67 s in a served start (run 132) and 15-17 s in
# bench/eager_warm_check.py? Starts the run-132 plan's server (debug logs: each warm-up step's ms and the
# allocator's work), then stops it, in these settings: both models (Triton cache cold), the 32B alone
# (--mode llm-only), both again (cache warm), both with --mps off.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/matrix/*.whl >/dev/null 2>&1
rm -rf /tmp/c /tmp/d; mkdir -p /tmp/c; tar xzf .whl/clean.tgz -C /tmp/c; cp -r .whl/diag /tmp/d; cd /tmp/c
export PYTHONPATH=/tmp/site:/tmp/c
start() {  # NAME ARGS...: start, wait for the URL, stop
  name=$1; shift; t0=$(date +%s.%N)
  python3 -m tokenrouter.cli serve /tmp/d/a/b/n4.plan --port 0 --log-level debug "$@" > /tmp/o.$name 2> $OUT/$name.stderr &
  pid=$!
  for i in $(seq 1 400); do grep -q "http://" /tmp/o.$name && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  echo "$name: ready after $(python3 -c "import sys; print(round($(date +%s.%N) - $t0, 1))") s"
  kill -INT $pid; wait $pid
  grep -h "warmed\|ready on" $OUT/$name.stderr | cut -c12-23,40-
  gzip $OUT/$name.stderr
}
case "${1:-all}" in
  all) start both-cold; start llm-alone --mode llm-only; start both-warm; start both-nomps --mps off;;
  cold) start both-cold;;
esac
