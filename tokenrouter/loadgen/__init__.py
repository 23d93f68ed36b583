"""The load generator behind `tokenrouter bench`: an HTTP client for any OpenAI-compatible completions endpoint
(`bench.py`: closed and open loops, the report) and its prefix workloads (`workloads.py`: shared prefixes,
multi-turn conversations). It imports nothing from the server side."""
