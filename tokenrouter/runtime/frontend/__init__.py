"""The HTTP frontend: an OpenAI-compatible API in front of the subservers (see docs/serving.md).

- `config.py`: FrontendArgs. `process.py`: the process entry `run_frontend_process`.
- `app.py`: FastAPI routes, API key, request body limit, error handlers. `handlers.py`: the generation
  endpoints' work (prompts, sampling settings, whole and streamed responses). `protocol.py`: request bodies
  and the OpenAI-style error.
- `request_manager.py`: the ZeroMQ side (submit, abort, release, outputs → requests, active count).
- `generation.py`: one choice: detokenizing, stop strings. `codec.py`: tokenizer and chat template.
- `metrics.py`: Prometheus text.
"""
