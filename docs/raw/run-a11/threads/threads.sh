#!/usr/bin/env bash
# Thirty-eighth session: is the old KV pool free's 8.8 ms per released row (two subservers warming up at once,
# run 132) thread oversubscription? First the copy alone (catcheck.py: one or two processes, 16/8/2/1 torch
# threads), then the run-132 plan's server started and stopped: old code (b64ed91^) with torch's default
# threads and with OMP_NUM_THREADS=8, and today's code with both.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/matrix/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
nproc; cat /sys/fs/cgroup/cpu.max 2>/dev/null; python3 -c "import torch;print('torch threads', torch.get_num_threads())"
timeout 150 python3 .whl/catcheck.py 400000 1500000 | tee $OUT/catcheck.txt
rm -rf /tmp/d; cp -r .whl/diag /tmp/d; W=$PWD
start() {  # NAME ARCHIVE ENV...: unpack the archive, start the server, wait for the URL, stop
  name=$1; arch=$2; shift 2; rm -rf /tmp/c; mkdir -p /tmp/c; tar xzf $W/.whl/$arch -C /tmp/c; cd /tmp/c
  t0=$(date +%s.%N)
  env PYTHONPATH=/tmp/site:/tmp/c "$@" python3 -m tokenrouter.cli serve /tmp/d/a/b/n4.plan --port 0 --log-level debug > /tmp/o.$name 2> $OUT/$name.stderr &
  pid=$!
  for i in $(seq 1 400); do grep -q "http://" /tmp/o.$name && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  echo "$name: ready after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
  kill -INT $pid; wait $pid
  grep -h "warmed\|ready on" $OUT/$name.stderr | cut -c12-23,40-
  gzip $OUT/$name.stderr; cd $W
}
start old-default old.tgz
start old-omp8 old.tgz OMP_NUM_THREADS=8
start new-default clean.tgz
start new-omp8 clean.tgz OMP_NUM_THREADS=8
