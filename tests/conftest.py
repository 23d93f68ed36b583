"""Under pytest-xdist (two workers, `addopts` in pyproject.toml) each worker, and every process its tests
start, computes on one CPU thread, so that the two workers share the machine's cores instead of
oversubscribing them: on the 2-core CI machine the suite took 8.2 min this way, 9.0 with torch's default
threads and 14.6 in one process. Set before torch is imported (conftests load before the test modules);
an explicit OMP_NUM_THREADS wins."""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
