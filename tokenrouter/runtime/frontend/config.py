"""The frontend process's settings (built by the launcher from the plan)."""

from __future__ import annotations

from dataclasses import dataclass, field

# A request body longer than this is refused (413) before it is read in full. 16 MiB holds a prompt of a
# 128K-token context at 128 bytes a token (a JSON token-id list takes about 7, text about 4, JSON-escaped
# non-ASCII text up to 12), and bounds the parse, which runs on the event loop (pydantic took 1 s for a
# 35 MB body of 5M token ids).
MAX_BODY_BYTES = 16 << 20
# A request body must arrive in full within this many seconds (a 408 otherwise): 16 MiB at 1 MB/s.
BODY_TIMEOUT_S = 30.0


@dataclass(slots=True)
class FrontendArgs:
    policy: str  # the model id clients name in requests
    entry: str  # the model that receives new requests
    models: list[str]
    model_dir: str  # the entry model's folder: tokenizer.json, tokenizer_config.json
    endpoints: dict  # Endpoints.to_dict()
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the launcher prints the one chosen)
    api_key: str | None = None
    run_dir: str | None = None
    max_len: int | None = None  # a cap on prompt + completion; the models' own limits (from Ready) also apply
    log_level: str = "warning"
    remote: list[str] = field(default_factory=list)  # models on other hosts: watched by heartbeat
    heartbeat_timeout_s: float = 10.0  # a remote model whose SubserverStats stop this long has failed
    liveness_timeout_s: float = 60.0  # the same for a local one (alive, but frozen or stuck)
    max_body_bytes: int = MAX_BODY_BYTES  # a longer request body gets a 413
    body_timeout_s: float = BODY_TIMEOUT_S  # a body not in full after this long gets a 408
    routing: str = ""  # the plan's `routing_digest`, published in /metrics (tokenrouter_plan_info)
    profile_dir: str | None = (
        None  # where POST /stop_profile has the subservers write their traces; None: off
    )

    def __post_init__(self) -> None:
        if not self.policy:
            raise ValueError("policy name must not be empty")
        if self.entry not in self.models:
            raise ValueError(f"entry model {self.entry!r} is not one of the models {self.models}")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError(f"max_len must be at least 2, got {self.max_len}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (leave it unset to disable authentication)")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}")
        if self.heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {self.heartbeat_timeout_s}")
        if self.liveness_timeout_s <= 0:
            raise ValueError(f"liveness_timeout_s must be > 0, got {self.liveness_timeout_s}")
        if self.body_timeout_s <= 0:
            raise ValueError(f"body_timeout_s must be > 0, got {self.body_timeout_s}")
        missing = [x for x in self.models if x not in self.endpoints.get("subservers", {})]
        if missing or "frontend" not in self.endpoints or "launcher" not in self.endpoints:
            raise ValueError(f"endpoints are incomplete (missing: {missing or 'frontend/launcher'})")
