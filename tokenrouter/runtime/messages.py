"""Every message that crosses a process boundary, grouped by destination. Nothing else lives here.

Messages are msgspec Structs, tagged so that one decoder per socket tells them apart; they travel as msgpack
over ZeroMQ (see `ipc.py`). Never pickle.

Who sends what (rid = request id, a str chosen by the frontend):
- frontend → entry subserver: `NewRequest`.
- frontend → every subserver: `Release` (the request finished: free its KV), `Abort` (client gone or a stop
  string matched), `ActiveCount` (the number of active requests n changed), `Shutdown`.
- subserver → subserver: `PeerRequest` (a hop: the request continues on the receiver).
- subserver → frontend: `StepOutputs` (tokens committed and requests finished in one step), `SubserverStats`.
- any process → launcher: `Progress` (a phase of a model's start-up done), `Ready`, `Fatal`.
- launcher → frontend: `Ready` (a subserver is ready), `Fatal` (a subserver failed or died).
"""

from __future__ import annotations

import msgspec


class SamplingSpec(msgspec.Struct, frozen=True):
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0  # the frontend always sets one (the client's, or drawn at arrival)
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int = (
        -1
    )  # ≥ 0: with each token its log-probability and this many most likely (TokenOut.logprobs)
    route_inputs: bool = False  # with each routed token, what its route decision read (TokenOut.route_inputs)
    # an llguidance grammar (JSON form) the completion must follow, on whichever model writes each token
    # (runtime/grammar.py); "": unconstrained
    grammar: str = ""
    # ≥ 0 (echo with logprobs): the entry model also scores the prompt, each prompt token after the first with
    # its log-probability and this many most likely (StepOutputs.prompts); max_tokens may then be 0
    prompt_logprobs: int = -1


# ---- frontend → subservers ------------------------------------------------------------------------------


class NewRequest(msgspec.Struct, tag=True):
    rid: str
    prompt_ids: list[int]
    sampling: SamplingSpec
    n_active: int  # active requests including this one
    count_seq: int = 0  # the frontend's number for this value of n (ActiveCount); 0: unnumbered


class Release(msgspec.Struct, tag=True):
    rid: str


class Abort(msgspec.Struct, tag=True):
    rid: str
    reason: str = "abort"


class ActiveCount(msgspec.Struct, tag=True):
    n_active: int
    # the frontend numbers every change of n: a subserver keeps the count with the highest number it has
    # seen, whichever message brought it (a hop carries its sender's); 0: unnumbered, always taken
    count_seq: int = 0


class Shutdown(msgspec.Struct, tag=True):
    pass


class Profile(msgspec.Struct, tag=True):
    """Start or stop `torch.profiler` over the subserver's steps (`POST /start_profile`, `/stop_profile`)."""

    model: str  # the model addressed (the lockstep process, which holds every model, gets one per model)
    start: bool  # False: stop, and write the trace into out_dir ("": discard it)
    out_dir: str = ""


# ---- subserver → subserver ------------------------------------------------------------------------------


class PeerRequest(msgspec.Struct, tag=True):
    """A hop. `tokens` are the request's tokens that the receiver has not seen yet, starting at sequence index
    `start` (the receiver's last known length; 0 on a first visit, then `tokens` = prompt + generated so far).
    `prompt_len` and `generated` let the receiver continue the counters; `drop` says the sender's sampled token
    was discarded (the receiver writes that position); `for_k` > 0 means: generate that many tokens, then hand
    back to `return_to` without consulting the receiver's own rules."""

    rid: str
    origin: str
    start: int
    tokens: list[int]
    prompt_len: int
    generated: int
    sampling: SamplingSpec
    drop: bool = False
    for_k: int = 0
    return_to: str | None = None
    n_active: int = 0
    count_seq: int = 0  # the number of the sender's n_active (ActiveCount); 0: unnumbered
    seen: dict[str, int] = {}  # model -> tokens of this request it has seen, as the sender knows (so the
    # next hop from the receiver sends each model only its unseen suffix)
    # the sender's time.monotonic() at the end of the step that sent it (0: unknown); the receiver counts the
    # hop's delay from it (Scheduler.count_hop_delay)
    sent_at: float = 0.0


class PeerBatch(msgspec.Struct, tag=True):
    """The hops one step sends to one peer, in order, as one message (`pack_hops`). Sent one by one they reach the receiver
    spread over a few tens of microseconds, and a receiver that wakes on the first may start a step before the
    rest are in (at B_i = 1, or once the first few reach B_i): the rest then wait a whole step. One message
    arrives whole (docs/runtime.md, "A step's hops as one message")."""

    hops: list[PeerRequest]


# ---- subservers → frontend ------------------------------------------------------------------------------


class TokenOut(msgspec.Struct):
    rid: str
    index: int  # index of token_ids[0] among the request's generated tokens
    token_ids: list[int]
    model: str  # the model that wrote these tokens
    hop_to: str | None = None  # set when this step ended with a hop to another model
    # per token, for a request with sampling.logprobs ≥ 0: [its log-probability, [[id, log-probability], ...]
    # of the most likely tokens], from the log-softmax of the logits `model` sampled it from (temperature 1)
    logprobs: list[list] | None = None
    # per route decision of this message, for a request with sampling.route_inputs (and a model whose route block
    # reads anything): {input: value} of what the decision read (features, uniform, router scores); one per
    # token, or one for the dropped token of a `drop` hop (empty token_ids)
    route_inputs: list[dict[str, float]] | None = None


class Finished(msgspec.Struct):
    rid: str
    reason: str  # "stop" (EOS / stop token), "length" (max_tokens), "error"
    model: str
    error: str | None = None


class PromptLogprobs(msgspec.Struct):
    """A prompt scored by `model` (the entry model, on the request's first step; sampling.prompt_logprobs ≥ 0):
    per prompt token after the first, [its log-probability given the tokens before it, [[id, log-probability],
    ...] of the most likely tokens at its position], from the log-softmax of the model's logits."""

    rid: str
    logprobs: list[list]


class StepOutputs(msgspec.Struct, tag=True):
    model: str
    tokens: list[TokenOut]
    finished: list[Finished]
    prompts: list[PromptLogprobs] = []  # before `finished`: a request's prompt is scored on its first step


class QueueStats(msgspec.Struct):
    """The requests a subserver holds, by state, as of its report."""

    waiting: int = 0
    running: int = 0
    pending: int = 0  # held while another model writes


class StepStats(msgspec.Struct):
    """A subserver's steps: exact totals since its scheduler started, and its last step."""

    count: int = 0
    rows: int = 0  # summed over steps
    new_tokens: int = 0  # tokens run: prefills, extend suffixes, one per decode row
    busy_ms: float = 0.0  # step wall time (forward + route kernel)
    # since the scheduler started, on busy_ms's clock: busy share = Δbusy_ms / Δuptime_ms over a window
    uptime_ms: float = 0.0
    last_batch_size: int = 0
    last_ms: float = 0.0
    batch_threshold: int = 0  # B_i as configured (0: unknown)
    # why each step started (batching.START_REASONS): its threshold reached, the threshold lowered while few
    # requests were active, every request the subserver holds runnable, or the max_delay timeout
    starts: dict[str, int] = {}
    # the steps that followed the previous one back to back (ready as it ended), and the host time between
    gaps: int = 0
    gap_ms: float = 0.0


class StepTables(msgspec.Struct):
    """A subserver's steps broken down: by batch size -> (steps, ms, new tokens), and by shape."""

    by_bs: dict[int, tuple[int, float, int]] = {}
    slow_by_bs: dict[int, tuple[int, float]] = {}  # the stalls among them (recorder.is_stall): (steps, ms)
    # the steps that no step of a model sharing the GPU overlapped (not stalls; busy_board.py); empty without a
    # busy board
    alone_by_bs: dict[int, tuple[int, float, int]] = {}
    # every step by its shape, keyed "BS/Q/OVERLAP": batch size, the new tokens of its longest row rounded up
    # to a power of two (recorder.q_class), and "alone" / "overlapped" (by a step of a model sharing the GPU;
    # busy_board.py), "stall", or "untracked" (no busy board) -> (steps, ms, new tokens)
    by_shape: dict[str, tuple[int, float, int]] = {}
    # the steps among those that ran some request's first tokens on this subserver (a prefill: KV from nothing),
    # same key -> (steps, ms, rows that were such first runs)
    first_by_shape: dict[str, tuple[int, float, int]] = {}


class KvStats(msgspec.Struct):
    """The KV pool: its pages, and under pressure the rows the scheduler left out of a step because the pool
    could not hold them without evicting (scheduler.fit_kv), the engine's evictions of held requests and the
    re-prefills they cost."""

    pages_total: int = 0
    pages_free: int = 0
    deferred_rows: int = 0
    evictions: int = 0
    reprefills: int = 0


class PrefixCacheStats(msgspec.Struct):
    """The engine's prefix cache (runtime/prefix_cache.py; off: `--no-prefix-cache`, or the SGLang engine):
    tokens reused vs computed when requests arrived (a request's first tokens here), arrivals, what the cache
    holds now, and the blocks it evicted."""

    enabled: bool = False
    matched_tokens: int = 0
    computed_tokens: int = 0
    arrivals: int = 0
    cached_blocks: int = 0
    cached_tokens: int = 0
    evicted_blocks: int = 0
    waited_rows: int = 0  # arrivals that waited a step for another arrival's prefill of the same prefix


class HopStats(msgspec.Struct):
    """The hops received with a send time, and their delay: from the send (or, where this subserver was in a
    step then, that step's end) to the scheduler taking the hop in; the throughput model takes hops as instant."""

    received: int = 0
    delay_ms: float = 0.0


class KernelLoadStats(msgspec.Struct):
    """The Triton kernels the subserver's process built (compiled, or loaded from Triton's disk cache) since the
    scheduler started, and the time they took (engine/kernel_loads.py); 0 under the Triton interpreter."""

    count: int = 0
    ms: float = 0.0


class SubserverStats(msgspec.Struct, tag=True):
    """A subserver's periodic report (also its heartbeat), grouped by what it counts."""

    model: str
    queue: QueueStats = msgspec.field(default_factory=QueueStats)
    step: StepStats = msgspec.field(default_factory=StepStats)
    tables: StepTables = msgspec.field(default_factory=StepTables)
    kv: KvStats = msgspec.field(default_factory=KvStats)
    prefix: PrefixCacheStats = msgspec.field(default_factory=PrefixCacheStats)
    hops: HopStats = msgspec.field(default_factory=HopStats)
    kernels: KernelLoadStats = msgspec.field(default_factory=KernelLoadStats)


# ---- any process → launcher -----------------------------------------------------------------------------


class ProfileDone(msgspec.Struct, tag=True):
    """A subserver's answer to `Profile`: started, or stopped with the files it wrote; or why not."""

    model: str
    start: bool
    files: list[str] = []
    error: str | None = None


class Progress(msgspec.Struct, tag=True):
    """A phase of a model's start-up, done (sent as it happens, before the model's `Ready`): `phase` is one of
    "torch" (imported), "weights" (loaded), "kv" (pool allocated), "graphs" (CUDA graphs captured), "kernels"
    (warmed); `detail` says what, for the line the launcher prints."""

    name: str  # the model
    phase: str
    detail: str


class Ready(msgspec.Struct, tag=True):
    name: str
    info: dict = {}


class Fatal(msgspec.Struct, tag=True):
    name: str
    error: str  # the traceback, for the log


ToSubserver = NewRequest | Release | Abort | ActiveCount | Shutdown | Profile | PeerRequest | PeerBatch
ToFrontend = (
    StepOutputs | SubserverStats | ProfileDone | Ready | Fatal
)  # Ready, Fatal: forwarded by the launcher
ToLauncher = Progress | Ready | Fatal


def pack_hops(out: list[tuple[str, msgspec.Struct]]) -> list[tuple[str, msgspec.Struct]]:
    """A step's outbox ((destination, message) pairs) with each peer's hops (`PeerRequest`s, in order) as one
    `PeerBatch` where it has more than one, at the place of the first: a step's hops to a peer arrive together."""
    hops: dict[str, list[PeerRequest]] = {}
    order: list = []  # a (destination, message) pair, or the name of a peer whose hops go here
    for dest, msg in out:
        if not isinstance(msg, PeerRequest):
            order.append((dest, msg))
        elif dest not in hops:
            hops[dest] = [msg]
            order.append(dest)
        else:
            hops[dest].append(msg)
    if all(len(got) == 1 for got in hops.values()):
        return out
    return [x if not isinstance(x, str) else (x, hops[x][0] if len(hops[x]) == 1 else PeerBatch(hops[x]))
            for x in order]  # fmt: skip


def unpack_hops(msgs: list) -> list:
    """Received messages with each `PeerBatch` replaced by its hops, in order."""
    if not any(isinstance(x, PeerBatch) for x in msgs):
        return msgs
    return [hop for x in msgs for hop in (x.hops if isinstance(x, PeerBatch) else (x,))]
