"""The processes of a tensor-parallel model (`gpus: [a, b, …]`): rank 0 is the subserver's own process (or the
offline engine's), ranks 1..n-1 are `run_tp_worker` processes it starts (multiprocessing spawn), one per rank.

`load_tp_engine(path, devices, …)` starts the followers, joins the group with them and loads rank 0's engine; every
follower loads its share of the same model with the same settings and then runs the steps rank 0 broadcasts
(`engine/parallel.py`). A follower leaves when rank 0 says stop, when its group breaks, or when its parent
process is gone (checked every half second), so that nothing outlives the subserver; a follower that fails
logs its traceback and exits 1, which rank 0 sees at once while the group starts (`watching`), and later at its
next step or within the next stats interval.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)
PARENT_POLL_S = 0.5


@dataclass(slots=True)
class TPWorkerArgs:
    path: str  # the model folder
    rank: int
    size: int
    port: int  # rank 0's rendezvous store on 127.0.0.1
    device: str  # "cpu" or "cuda:<gpu>"
    threads: int  # torch intra-op threads
    engine: dict = field(default_factory=dict)  # load_engine settings, as rank 0's
    log_level: str = "INFO"


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)  # rank 0 is gone: nothing to follow


def run_tp_worker(args: TPWorkerArgs) -> None:
    """The entry function of the process of one follower rank."""
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s tp-rank[{args.rank}] %(message)s")  # fmt: skip
    parent = os.getppid()
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch", daemon=True).start()
    code = 0
    try:
        import torch

        from tokenrouter.runtime.engine.embedded import load_engine
        from tokenrouter.runtime.engine.parallel import connect, follow

        torch.set_num_threads(args.threads)
        group = connect(args.rank, args.size, torch.device(args.device), port=args.port)
        engine = load_engine(args.path, device=args.device, tp=group, **args.engine)
        group.ready()
        follow(engine)
    except BaseException:
        if os.getppid() == parent:  # rank 0 alive: a failure of this rank, not the end of the group
            logger.error("crashed:\n%s", traceback.format_exc())
            code = 1
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)


def tp_devices(gpus: list[int], device: str) -> list[str]:
    """One device per rank: `cpu` for every rank on CPU, else `cuda:<gpu>` for each of the model's GPUs."""
    if str(device).startswith("cuda"):
        return [f"cuda:{g}" for g in gpus]
    return ["cpu"] * len(gpus)


def _start_followers(
    path: str, devices: list[str], port: int, threads: int, shared: dict, level: str
) -> list:
    """Start ranks 1.. of the group, one process each (spawned, daemonic)."""
    import multiprocessing as mp

    size = len(devices)
    spawn = mp.get_context("spawn")
    followers = []
    for rank in range(1, size):
        args = TPWorkerArgs(str(path), rank, size, port, devices[rank], threads, shared, level)
        followers.append(spawn.Process(target=run_tp_worker, args=(args,), name=f"tokenrouter-tp-rank{rank}",
                                       daemon=True))  # fmt: skip
    for p in followers:
        p.start()
    return followers


def load_tp_engine(path: str, devices: list[str], *, threads: int | None = None, log_level: str | None = None,
                   **engine):  # fmt: skip
    """Rank 0's engine of the model at `path` over `devices` (one per rank), its followers started and joined.
    `engine`: load_engine's settings (rank 0's `engine_class` and `progress` stay with rank 0). A follower that
    exits before the group is formed, or before its engine is built, is a TPError naming it (rank 0 does not wait
    on a rank that is gone)."""
    import torch

    from tokenrouter.runtime.engine.config import load_model_config
    from tokenrouter.runtime.engine.embedded import load_engine
    from tokenrouter.runtime.engine.models.tp_layers import shard_config
    from tokenrouter.runtime.engine.parallel import connect, make_store

    size = len(devices)
    # a size that does not divide the model is refused before any rank starts
    shard_config(load_model_config(path), size)
    store = make_store(size)
    shared = {k: v for k, v in engine.items() if k not in ("engine_class", "progress")}
    level = str(log_level or logging.getLevelName(logging.getLogger().getEffectiveLevel()))
    threads = threads or torch.get_num_threads()
    followers = _start_followers(path, devices, store.port, threads, shared, level)
    try:
        group = watching(
            followers, "joining the group", lambda: connect(0, size, torch.device(devices[0]), store=store)
        )
        group.followers = followers
        built = load_engine(path, device=devices[0], tp=group, **engine)
        watching(followers, "loading the model", group.ready)
        return built
    except BaseException:
        for p in followers:
            if p.is_alive():
                p.kill()
        raise


def watching(followers: list, what: str, fn):
    """`fn()`, run in a thread while this one watches the follower processes: a follower that exits first is a
    TPError naming it, instead of a wait for a rank that is gone (a collective's own timeout)."""
    from tokenrouter.runtime.engine.parallel import TP_TIMEOUT_S, TPError

    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the caller's thread
            out["error"] = e

    thread = threading.Thread(target=run, name=f"tp-{what}", daemon=True)
    thread.start()
    deadline = time.monotonic() + TP_TIMEOUT_S
    while thread.is_alive():
        thread.join(0.05)
        for rank, p in enumerate(followers, start=1):
            if p.exitcode is not None and thread.is_alive():
                code = p.exitcode
                how = f"killed by signal {-code}" if code < 0 else f"status {code}"
                raise TPError(
                    f"tensor-parallel rank {rank} of {len(followers) + 1} exited ({how}) while {what}"
                )
        if time.monotonic() > deadline:
            raise TPError(f"tensor-parallel ranks still not done {what} after {TP_TIMEOUT_S:.0f} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")
