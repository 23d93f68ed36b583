"""What a load is (`LoadSpec`, checked when made), one request of it (`Request`), what one request gave
(`RequestResult`), and a load that cannot be served as asked (`LoadRefused`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(slots=True)
class LoadSpec:
    url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: the first id that /v1/models lists
    concurrency: int | None = 4  # requests in flight at most; None: no cap (an open loop only)
    request_rate: float = math.inf  # requests per second; inf: a closed loop of `concurrency` workers
    burstiness: float = 1.0  # the gamma shape of an open loop's gaps between arrivals (1: Poisson)
    warmup: int = 0  # requests sent before the measured ones, not counted
    # service-level objectives: a request meets them when its TTFT and its TPOT are within these (None: no
    # bound); the report's goodput counts the requests that do
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    num_prompts: int = 32
    output_len: int = 128
    prompt_len: int = 32
    prompts_file: str | None = None  # one prompt a line (text), or JSON lines (`.jsonl`): read_prompts_file
    ignore_eos: bool = True
    temperature: float = 0.0
    seed: int = 0
    api_key: str | None = None
    timeout_s: float = 600.0
    vocab_low: int = 10  # synthetic prompts draw token ids in [vocab_low, vocab_high)
    vocab_high: int = 200
    progress: bool = True
    # prefix workloads (workloads.py): a shared prefix of this many synthetic tokens in each of `prefix_groups`
    # groups before each prompt's own `prompt_len`; or conversations of `turns` turns (num_prompts of them), a
    # shared system prompt of `system_len` tokens, user messages of `prompt_len`, a think time between turns
    shared_prefix_len: int = 0
    prefix_groups: int = 1
    turns: int = 0
    system_len: int = 0
    think_time_s: float = 0.0
    conversation_file: bool = False  # set from the prompts file: its lines are conversations (workloads.py)

    def __post_init__(self) -> None:
        # the server's base URL; an OpenAI client's base URL ends in /v1, which the paths here already have
        self.url = self.url.rstrip("/").removesuffix("/v1")
        self._check_load()
        self._check_prompts()
        self._check_workload()

    def _check_load(self) -> None:
        """The load's shape: concurrency, rate, burstiness, warm-up, SLOs."""
        if self.concurrency is None and self.closed_loop:
            raise ValueError("a closed loop needs a concurrency; give a request rate for an open loop")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not self.request_rate > 0:  # NaN too
            raise ValueError(f"request rate must be > 0 requests per second, got {self.request_rate}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be a finite number > 0, got {self.burstiness}")
        if self.closed_loop and self.burstiness != 1.0:
            raise ValueError("burstiness shapes an open loop's arrivals: give a request rate with it")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        for name in ("slo_ttft_ms", "slo_tpot_ms"):
            bound = getattr(self, name)
            if bound is not None and not (bound > 0 and math.isfinite(bound)):
                raise ValueError(f"{name} must be a finite number of ms > 0, got {bound}")

    def _check_prompts(self) -> None:
        """The requests: how many, their lengths, the prompts file, the temperature, the synthetic vocabulary."""
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len}")
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {self.prompt_len}")
        if self.prompts_file is not None and not Path(self.prompts_file).is_file():
            what = "is a folder" if Path(self.prompts_file).is_dir() else "not found"
            raise ValueError(f"prompts file {what}: {self.prompts_file}")
        if self.prompts_file is not None:
            from tokenrouter.loadgen.workloads import is_conversation_file

            self.conversation_file = is_conversation_file(self.prompts_file)
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 <= self.vocab_low < self.vocab_high:
            raise ValueError("need 0 <= vocab_low < vocab_high")

    def _check_workload(self) -> None:
        """The prefix workloads: a shared prefix, or conversations."""
        for name in ("shared_prefix_len", "turns", "system_len"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.prefix_groups < 1:
            raise ValueError(f"prefix_groups must be >= 1, got {self.prefix_groups}")
        if not (math.isfinite(self.think_time_s) and self.think_time_s >= 0):
            raise ValueError(f"think time must be a finite number of seconds >= 0, got {self.think_time_s}")
        if self.turns and self.shared_prefix_len:
            raise ValueError("give a shared prefix or conversations (--turns), not both")
        if (self.system_len or self.think_time_s) and not self.conversations:
            raise ValueError("--system-len and --think-time shape conversations: give --turns with them")
        if (self.shared_prefix_len or self.prefix_groups > 1 or self.turns) and self.prompts_file:
            raise ValueError(
                "a prompts file gives its own prompts: no --shared-prefix-len, --prefix-groups or --turns"
            )
        if self.conversations and not self.closed_loop:
            raise ValueError("conversations run as a closed loop: give --concurrency, not --request-rate")

    @property
    def closed_loop(self) -> bool:
        return math.isinf(self.request_rate)

    @property
    def conversations(self) -> bool:
        """Whether the load is conversations (`--turns`, or a conversations file)."""
        return self.turns > 0 or self.conversation_file

    def describe(self) -> str:
        """The load in words, as the report's table heads it."""
        if self.conversations:
            what = (
                f"{self.turns} turns, system prompt {self.system_len}" if self.turns else "conversations file"
            )
            return f"{self.num_prompts} conversations ({what}), {self.concurrency} at once"
        if self.shared_prefix_len:
            shared = f", a {self.shared_prefix_len}-token prefix shared in {self.prefix_groups} group(s)"
        else:
            shared = ""
        if self.closed_loop:
            return f"closed loop, {self.concurrency} in flight{shared}"
        kind = "Poisson" if self.burstiness == 1.0 else f"gamma gaps, burstiness {self.burstiness:g}"
        cap = f"at most {self.concurrency} in flight" if self.concurrency else "no cap on requests in flight"
        return f"open loop, {self.request_rate:g} requests/s ({kind}), {cap}"


@dataclass(slots=True)
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    tokens_per_model: dict[str, int] = field(default_factory=dict)
    hops: int = 0
    error: str | None = None
    start_s: float = 0.0  # when it was sent, seconds after the run's start
    queued_s: float = 0.0  # an open loop's wait at the concurrency cap, from its arrival to its send
    text: str = ""  # the completion's text
    token_ids: list[int] | None = None  # its token ids, where the server returned them (`return_token_ids`)
    conversation: int = -1  # a conversation load's: which conversation, and which turn (from 1)
    turn: int = 0


@dataclass(frozen=True, slots=True)
class Request:
    """One request of the load: its prompt (text, or token ids) and the tokens it asks for (`max_tokens`)."""

    prompt: str | list[int]
    output_len: int


class LoadRefused(ValueError):
    """The load cannot be served as asked (the message says why); nothing was sent."""


class ContextTooLong(LoadRefused):
    """The load's prompts and output tokens do not fit the served model's context."""
