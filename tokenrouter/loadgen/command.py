"""The work of `tokenrouter bench` around the load generator (`loadgen/bench.py`): the load checked before
anything is sent, the run, the report written. `load_spec` raises `ValueError` for a usage mistake, `run_bench`
raises `LoadRefused` (usage) or `BenchError` (the server could not be benchmarked), and `write_json` `OSError`."""

from __future__ import annotations

import asyncio
import math

from tokenrouter.loadgen.bench import LoadSpec, make_requests


class BenchError(Exception):
    """The load did not run: connection refused, a bad URL (the message says which, for the user)."""


def load_spec(concurrency: int | None, request_rate: float | None, think_time: float, **fields) -> LoadSpec:
    """`bench`'s LoadSpec: `fields` by LoadSpec's names; a closed loop runs 4 workers unless told, an open one
    (`request_rate`) has no cap. A prompts file's bad line is a usage error here, before anything is sent."""
    spec = LoadSpec(
        concurrency=concurrency if concurrency is not None or request_rate is not None else 4,
        request_rate=math.inf if request_rate is None else request_rate,
        think_time_s=think_time,
        **fields,
    )
    make_requests(spec)
    return spec


def check_json_out(path: str) -> None:
    """Before the run, which a report that cannot be written would lose: `OSError` when `path` cannot be."""
    from tokenrouter.outfile import check_output

    check_output(path)


def run_bench(spec: LoadSpec) -> dict:
    """The report of the load against the server."""
    from tokenrouter.loadgen import bench

    try:
        return asyncio.run(bench.run_load(spec))
    except bench.LoadRefused:
        raise
    except Exception as exc:  # connection refused, bad URL: a user-facing condition, not a bug
        raise BenchError(f"could not benchmark {spec.url}: {type(exc).__name__}: {exc}") from exc
