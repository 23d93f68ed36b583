"""How a burst of hops reaches a waiting subserver: one ZeroMQ message per hop, or the step's hops to that peer
as one `PeerBatch` (runtime/messages.py, `pack_hops`). A sender process sends bursts of K hops over IPC as
a subserver's `dispatch` does; the receiver waits as a subserver's `_receive` does (poll, then drain what is
queued) and counts how many hops each wake-up found. A wake-up that finds part of a burst is where a
subserver at B_i = 1 (or one whose first hops reach B_i) starts a step without the rest, which then wait for
that step to end (docs/runtime.md, "A step's hops as one message").

    python3 bench/hop_burst.py            # 200 bursts of 7, both ways
    python3 bench/hop_burst.py --bursts 500 --size 4
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import zmq  # noqa: E402

from tokenrouter.runtime import messages as m  # noqa: E402
from tokenrouter.runtime.ipc import Receiver, Sender  # noqa: E402


def _send(addr: str, size: int, bursts: int, packed: bool) -> None:
    ctx = zmq.Context()
    push = Sender(ctx, addr, unbounded=True)
    time.sleep(0.3)  # let the receiver bind and settle
    for k in range(bursts):
        out = [("peer", m.PeerRequest(f"r{k}-{i}", "a", 600, [1, 2, 3, 4], 32, 500, m.SamplingSpec()))
               for i in range(size)]  # fmt: skip
        for _, msg in m.pack_hops(out) if packed else out:
            push.send(msg)
        time.sleep(0.005)  # a step's length between bursts
    push.sock.close(linger=1000)
    ctx.term()


def wakeups(size: int, bursts: int, packed: bool) -> collections.Counter:
    """{hops found by a wake-up: how many wake-ups}, over `bursts` bursts of `size` hops."""
    ctx = zmq.Context()
    addr = f"ipc://{tempfile.mkdtemp()}/pull"
    pull = Receiver(ctx, addr, m.ToSubserver, unbounded=True)
    sender = mp.get_context("spawn").Process(target=_send, args=(addr, size, bursts, packed))
    here = str(Path(__file__).resolve().parent)  # the spawned sender imports this module by name from bench/
    sys.path.insert(0, here)
    try:
        sender.start()
    finally:
        sys.path.remove(here)
    found, got = collections.Counter(), 0
    try:
        while got < size * bursts:
            wait_s = 5 if got else 120  # the sender process starts and imports first
            if not pull.poll(wait_s * 1000):
                raise RuntimeError(f"no hop for {wait_s} s after {got} of {size * bursts}")
            hops = m.unpack_hops(pull.drain())
            got += len(hops)
            found[len(hops)] += 1
    finally:
        sender.join(10)
        pull.sock.close(0)
        ctx.term()
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=7, help="hops per burst (one step's hops to one peer)")
    ap.add_argument("--bursts", type=int, default=200)
    a = ap.parse_args(argv)
    if a.size < 2 or a.bursts < 1:
        print("error: --size must be >= 2 and --bursts >= 1", file=sys.stderr)
        return 2
    print(f"{a.bursts} bursts of {a.size} hops: how many hops each wake-up of the receiver found\n")
    print("| sent as | wake-ups | found the whole burst | hops found: wake-ups |")
    print("| --- | ---: | ---: | --- |")
    for packed in (False, True):
        found = wakeups(a.size, a.bursts, packed)
        whole = sum(n for k, n in found.items() if k >= a.size)
        print(f"| {'one PeerBatch' if packed else 'one message per hop'} | {sum(found.values())} | {whole} | "
              + ", ".join(f"{k}: {n}" for k, n in sorted(found.items())) + " |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
