"""A model's subserver: the scheduler core (`scheduler.py`) and its accounting (`recorder.py`), delayed batching
(`batching.py`), the request state (`req.py`) and the process that runs it over ZeroMQ (`process.py`). See
docs/runtime.md."""
