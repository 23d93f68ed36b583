"""Does parsing a large request body in a worker thread keep the event loop's thread free? (forty-second session)

Parses a 3.4 MiB token-id completion body with the server's own `parse_body`, once inline and once in a
thread, and prints how long the main thread could not run while the thread parsed.
Usage: python3 docs/raw/offline-42/parse_gil.py
"""

import json
import threading
import time

from tokenrouter.runtime.frontend.protocol import CompletionRequest, parse_body

body = json.dumps({"model": "x", "prompt": [[5] * 1000] * 1200, "max_tokens": 5}).encode()
t0 = time.perf_counter()
parse_body(CompletionRequest, body)
print(f"body {len(body) / 2**20:.1f} MiB, parsed inline in {time.perf_counter() - t0:.3f} s")
done = threading.Event()
t0 = time.perf_counter()
worker = threading.Thread(target=lambda: (parse_body(CompletionRequest, body), done.set()))
worker.start()
started = time.perf_counter() - t0
worst = 0.0
while not done.is_set():
    a = time.perf_counter()
    time.sleep(0.001)
    worst = max(worst, time.perf_counter() - a)
worker.join()
print(
    f"in a thread: Thread.start() returned after {started:.3f} s, then the longest 1 ms sleep took {worst:.3f} s"
)
