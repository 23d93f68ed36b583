"""How long `tokenrouter serve` takes to start and to stop, and whether every process it started is gone.

Starts `tokenrouter serve PLAN --port 0 --device cpu` (or `--device cuda`; in a session of its own, as a terminal would), prints
each line the launcher writes with the seconds since the start, then sends the signal: SIGINT to the
launcher's process group (Ctrl-C in a terminal), SIGTERM to the launcher alone (`kill PID`, a supervisor).
Reports the seconds from the signal to the launcher's exit and to the last process of the session gone,
and names any process of the session still alive 10 s after the signal (then kills it).

    python3 bench/serve_lifecycle.py                      # examples/bernoulli.tr, SIGINT and SIGTERM, once
    python3 bench/serve_lifecycle.py PLAN --signals INT --repeat 3
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINGER_S = 10.0  # after the signal, how long to wait for the session to empty before naming the survivors


def session_pids(sid: int) -> list[int]:
    """The live (not zombie) processes of session `sid`, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, session
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(entry))
    return out


def describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmd = "?"
    return f"{pid} {cmd.strip()[:120]}"


def one_run(plan: str, sig: str, timeout_s: float, device: str) -> dict:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenrouter.cli", "serve", plan, "--port", "0", "--device", device],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put("")], daemon=True
    ).start()
    url = None
    while url is None and time.monotonic() - t0 < timeout_s:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if not line:
            break
        print(f"  {time.monotonic() - t0:6.2f} s  {line.rstrip()}")
        if found := re.search(r"http://\S+", line):
            url = found.group(0)
    if url is None:
        proc.kill()
        raise SystemExit(f"serve did not start within {timeout_s:g} s")
    time.sleep(1.0)  # let the deployment settle (stats, heartbeats)
    sid = proc.pid
    before = session_pids(sid)
    sent = time.monotonic()
    if sig == "INT":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    launcher_s = None
    all_s = None
    while time.monotonic() - sent < LINGER_S and all_s is None:
        gone = proc.poll() is not None
        if not session_pids(sid):
            all_s = time.monotonic() - sent
        if launcher_s is None and (gone or all_s is not None):  # the launcher is of the session
            launcher_s = time.monotonic() - sent
        time.sleep(0.01)
    survivors = session_pids(sid)
    for pid in survivors:
        print(f"  survivor: {describe(pid)}")
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    while line := lines.get():
        print(f"  (after the signal) {line.rstrip()}")
    return dict(sig=sig, procs=len(before), launcher_s=launcher_s, all_s=all_s, survivors=len(survivors))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", nargs="?", default=str(ROOT / "examples" / "bernoulli.tr"))
    ap.add_argument("--signals", default="INT,TERM", help="comma-separated: INT, TERM")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the URL line")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args()
    rows = []
    for _ in range(args.repeat):
        for sig in args.signals.split(","):
            print(f"serve {args.plan}, then SIG{sig}:")
            rows.append(one_run(args.plan, sig.strip().upper(), args.timeout, args.device))
    print("\n| signal | processes | launcher exit (s) | session empty (s) | survivors |")
    print("|---|---|---|---|---|")
    for r in rows:
        cells = [f"> {LINGER_S:g}" if x is None else f"{x:.2f}" for x in (r["launcher_s"], r["all_s"])]
        print(f"| SIG{r['sig']} | {r['procs']} | {cells[0]} | {cells[1]} | {r['survivors']} |")


if __name__ == "__main__":
    main()
