#!/usr/bin/env bash
# call 6 of the nineteenth session: which state a server's engine runs in (its default graph shapes), and how
# small a further capture moves the graphs (bench/step_partner.py --server-graphs --phases tiny,one,capture)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/matrix/*.whl || exit 1
rm -rf /tmp/res; mkdir -p /tmp/res
export PYTHONPATH=/tmp/site:$PWD
timeout 230 python3 bench/step_partner.py --server-graphs --points 1x4,1x8,4x8 --decode-bs 1,4,32 --phases tiny,one,capture --out /tmp/res/partner > /tmp/res/partner.md 2> /tmp/res/partner.err; echo rc=$?
cat /tmp/res/partner.md; grep -v Warn /tmp/res/partner.err | tail -3
tar czf $OUT/call6.tgz -C /tmp/res .
