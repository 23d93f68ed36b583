#!/usr/bin/env bash
# Thirty-eighth session, device call 4: what the KV pool's old free cost std-serving (every hop releases a
# request): std-serving N = 8 at p = 0.35 on the old code (b64ed91^) with torch's default threads, on the old
# code with OMP_NUM_THREADS=8, and on today's code (cb1e854: pool fixed, threads divided among the models).
A="--pair 0.6b+8b --policy bern0.35 --run std-serving:8 --rounds 4 --max-delay-ms 20 --serve-arg=--log-level=info"
ARCH=old.tgz PART_S=210 bash .whl/part3.sh call4a run138 $A
ARCH=old.tgz OMP_NUM_THREADS=8 PART_S=150 bash .whl/part3.sh call4b run139 $A
ARCH=clean.tgz PART_S=150 bash .whl/part3.sh call4c run140 $A
