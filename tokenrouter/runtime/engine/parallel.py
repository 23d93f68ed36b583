"""Tensor parallelism of the embedded engine: one model over `tp` ranks, one process per rank.

Rank 0 is the engine the subserver steps: it owns the scheduler, the KV allocation, the prefix cache and the
route kernel. Ranks 1..tp-1 are followers (`follow`): each holds its share of the weights
(`models/tp_layers.py`) and of the KV pool (num_key_value_heads/tp heads of every slot), allocates nothing and
decides nothing. Before each model step rank 0 broadcasts the step's inputs (`ForwardBatch.host_ints`: token
ids, positions, KV slots, request rows, lengths; with the request-table rows it wrote outside a step, as the
prefix cache does) and every rank runs the same forward, meeting at the all-reduces and the logits'
all-gather; an embedding lookup (a route feature) and a teacher-forced pass go the same way. The slot and row
ids rank 0 hands out index every rank's pools alike, so the followers' request tables stay copies of its own.

Communication: two process groups over one TCP store, made without `torch.distributed`'s global state (a
process may hold several engines): `data` for the activations (NCCL on CUDA, gloo on CPU) and `control`
(gloo on the host) for the broadcasts. On CUDA the all-reduces of a graph-captured step are captured with it
(NCCL collectives are capturable): the followers capture the same graphs in the same order, as they run the
same constructor, and replay the one rank 0 replays. The fused Triton decoder runs its projections as its own
GEMV kernels, around the modules' forwards, so a tensor-parallel engine runs the decoder's plain forward with
the Triton attention.

Failures: a collective that cannot complete (a rank died: its sockets close; or it hangs past
`TP_TIMEOUT_S`) raises `TPError`, which is not an `EngineError`: the scheduler does not retry it, the subserver
crashes, the launcher fails the model's requests and exits. Rank 0 also checks its followers' processes before
each step and in `stats()`, which the subserver calls every half second, so a follower that dies while the
model is idle ends the deployment as well.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tokenrouter.runtime.engine.forward_batch import ForwardBatch, ForwardMode
from tokenrouter.runtime.engine.memory_pool import ReqToTokenPool

logger = logging.getLogger(__name__)

TP_TIMEOUT_S = 300.0  # the longest one collective of a step may wait (a CUDA graph capture included)
IDLE_TIMEOUT = datetime.timedelta(days=365)  # a follower waits for rank 0's next step as long as it lives
STOP, STEP, EMBED, FULL = range(4)  # the commands rank 0 broadcasts
DEAD_RANK_WAIT_S = 1.0  # after a failed collective, how long rank 0 waits to see which follower exited
HEADER = 4  # [command, payload length, tokens, rows]
CPU = torch.device("cpu")


class TPError(RuntimeError):
    """A rank of a tensor-parallel model failed or left: the model cannot step any more."""


@dataclass(slots=True)
class TPGroup:
    """This process's place in a tensor-parallel group and its two process groups."""

    rank: int
    size: int
    data: object  # activations' all-reduce / all-gather: NCCL on CUDA, gloo on CPU
    control: object  # gloo: rank 0's broadcasts of each step
    # rank 0: the processes of ranks 1..size-1 (multiprocessing: exitcode, join)
    followers: list = field(default_factory=list)
    store: object = None  # the rendezvous store, kept alive with the groups (rank 0's serves the others)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns it."""
        self._wait(self.data.allreduce([x]), "all-reduce")
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x`, concatenated along the last dimension in rank order."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self._wait(self.data.allgather([parts], [x]), "all-gather")
        return torch.cat(parts, dim=-1)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` (a CPU tensor) on every rank, in place."""
        self._wait(self.control.broadcast(x, 0), "broadcast")
        return x

    def _wait(self, work, what: str) -> None:
        try:
            work.wait()
        except Exception as e:  # gloo: a peer's socket closed, or the timeout; NCCL: its own errors
            for proc in self.followers:  # rank 0: a follower that died is the cause to name
                proc.join(DEAD_RANK_WAIT_S / len(self.followers))
            try:
                self.check_followers()
            except TPError as dead:
                raise TPError(f"{dead} during a step's {what}") from e
            raise TPError(f"tensor-parallel {what} failed on rank {self.rank} of {self.size}: {e}") from e

    def ready(self) -> None:
        """Every rank's engine is built: each rank calls this once after building its engine."""
        self._wait(self.control.allreduce([torch.ones(1)]), "start-up handshake")

    def check_followers(self) -> None:
        """TPError naming the first follower process that has exited (rank 0; nothing elsewhere)."""
        for rank, proc in enumerate(self.followers, start=1):
            if proc.exitcode is not None:
                raise TPError(
                    f"tensor-parallel rank {rank} of {self.size} exited ({_exit_text(proc.exitcode)})"
                )


def _exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"status {code}"


def make_store(size: int, host: str = "127.0.0.1", port: int = 0) -> dist.TCPStore:
    """Rank 0's rendezvous store (port 0: a free one, read back as `store.port`)."""
    timeout = datetime.timedelta(seconds=TP_TIMEOUT_S)
    return dist.TCPStore(host, port, size, True, timeout=timeout, wait_for_workers=False)


def connect(rank: int, size: int, device: torch.device, store: dist.Store | None = None,
            host: str = "127.0.0.1", port: int = 0) -> TPGroup:  # fmt: skip
    """Join the group: rank 0 passes its `store` (`make_store`), the others its host and port. Returns once every
    rank has joined (the process groups' rendezvous)."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in 0..{size - 1}")
    timeout = datetime.timedelta(seconds=TP_TIMEOUT_S)
    if store is None:
        store = dist.TCPStore(host, port, size, False, timeout=timeout)
    control = dist.ProcessGroupGloo(dist.PrefixStore("control", store), rank, size, IDLE_TIMEOUT)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        data = dist.ProcessGroupNCCL(dist.PrefixStore("data", store), rank, size, options)
    else:
        data = dist.ProcessGroupGloo(dist.PrefixStore("data", store), rank, size, timeout)
    return TPGroup(rank, size, data, control, store=store)


# ---- the step broadcast -------------------------------------------------------------------------------------


class MirroredReqToTokenPool(ReqToTokenPool):
    """Rank 0's request table: the rows written outside a step (`write`, e.g. a prefix cache's hit) are kept
    until the next broadcast, which carries them to the followers' tables."""

    def __init__(self, size: int, max_context_len: int, device: torch.device | str) -> None:
        super().__init__(size, max_context_len, device)
        self.pending: list[tuple[int, int, torch.Tensor]] = []

    def write(self, index: int, start: int, locs: torch.Tensor) -> None:
        super().write(index, start, locs)
        self.pending.append((index, start, locs.to(CPU, torch.int64).flatten()))

    def take_pending(self) -> list[int]:
        """The pending writes as ints: (row, start, length) each, then every write's slots; cleared."""
        heads = [v for index, start, locs in self.pending for v in (index, start, locs.numel())]
        slots = [s for _, _, locs in self.pending for s in locs.tolist()]
        count = len(self.pending)
        self.pending = []
        return [count, *heads, *slots]


def send(group: TPGroup, command: int, payload: Sequence[int] | torch.Tensor = (), tokens: int = 0,
         rows: int = 0) -> None:  # fmt: skip
    """Rank 0: broadcast one command (a header, then its int64 payload)."""
    body = torch.as_tensor(payload, dtype=torch.int64).flatten()
    group.broadcast(torch.tensor([command, body.numel(), tokens, rows], dtype=torch.int64))
    if body.numel():
        group.broadcast(body.clone())


def receive(group: TPGroup) -> tuple[int, torch.Tensor, int, int]:
    """A follower: the next command, its payload, and its token and row counts."""
    header = group.broadcast(torch.zeros(HEADER, dtype=torch.int64))
    command, n, tokens, rows = header.tolist()
    body = group.broadcast(torch.empty(n, dtype=torch.int64)) if n else torch.empty(0, dtype=torch.int64)
    return command, body, tokens, rows


def step_payload(fb: ForwardBatch, pool: ReqToTokenPool) -> list[int] | torch.Tensor:
    """What a follower needs to run `fb`: the request-table writes rank 0 made since the last step, then the
    batch's host ints."""
    writes = pool.take_pending() if isinstance(pool, MirroredReqToTokenPool) else [0]
    return torch.cat([torch.tensor(writes, dtype=torch.int64), fb.host_ints])


def apply_step(body: torch.Tensor, tokens: int, rows: int, engine) -> ForwardBatch:
    """A follower: apply the step's request-table writes to `engine`'s table and rebuild its batch."""
    count = int(body[0])
    heads = body[1 : 1 + 3 * count].view(count, 3).tolist()
    at = 1 + 3 * count
    for index, start, n in heads:
        engine.req_to_token_pool.write(index, start, body[at : at + n])
        at += n
    return batch_from_host(body[at:].clone(), tokens, rows, engine)


def batch_from_host(host: torch.Tensor, tokens: int, rows: int, engine) -> ForwardBatch:
    """The `ForwardBatch` whose `host_ints` rank 0 broadcast (its layout: forward_batch.py)."""
    parts = ForwardBatch._device_parts(host, tokens, rows, CPU)  # noqa: SLF001 (the layout's one reader)
    seq = tuple(parts["seq_lens"].tolist())
    prefix = tuple(parts["extend_prefix_lens"].tolist())
    ext = tuple(parts["extend_seq_lens"].tolist())
    mode = ForwardMode.DECODE if max(ext) == 1 else ForwardMode.EXTEND if min(ext) > 1 else ForwardMode.MIXED
    return ForwardBatch(
        forward_mode=mode,
        batch_size=rows,
        num_tokens=tokens,
        **parts,
        seq_lens_cpu=seq,
        extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=ext,
        max_seq_len=max(seq),
        max_extend_len=max(ext),
        req_to_token_pool=engine.req_to_token_pool,
        token_to_kv_pool=engine.token_to_kv_pool,
        host_ints=host,
    )


# ---- the engine -----------------------------------------------------------------------------------------------


class TensorParallelEngine:
    """Mixed in before an `EmbeddedEngine` class (`tp_engine_class`): the same engine on one rank of `group`.
    On rank 0 every model call broadcasts first (see the module docstring); a follower's calls come from
    `follow`. Construction is collective: every rank builds its engine at the same time with the same settings."""

    tp: TPGroup

    eager_built_at_start = False  # the steps of a rank's start-up would wait on followers still building

    def __init__(self, *args, group: TPGroup, **kwargs) -> None:
        self.tp = group
        super().__init__(*args, **kwargs)

    def _free_device_memory(self) -> int:
        """The least free memory of the group's GPUs: every rank's KV pool is the same size."""
        free = torch.tensor([super()._free_device_memory()], dtype=torch.int64, device=self.device)
        return int(self.tp.all_gather_last(free).min())

    def _init_pools(self) -> None:
        super()._init_pools()
        if self.tp.leader:
            old = self.req_to_token_pool
            self.req_to_token_pool = MirroredReqToTokenPool(old.size, old.max_context_len, old.device)

    def _init_attention(self) -> None:
        super()._init_attention()
        if getattr(self.attn_backend, "fused_ops", False):  # its GEMVs would skip the all-reduces
            self.attn_backend.fused_ops = False

    def _model_info(self, name: str):
        info = super()._model_info(name)
        info.scores_prompts = False  # a scored step's wider output is not broadcast to the followers
        return info

    def _run_model(self, fb: ForwardBatch):
        if self.tp.leader:
            self.tp.check_followers()
            send(self.tp, STEP, step_payload(fb, self.req_to_token_pool), fb.num_tokens, fb.batch_size)
        return super()._run_model(fb)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.leader:
            self.tp.check_followers()
            send(self.tp, EMBED, token_ids.to(CPU))
        return super().embed(token_ids)

    def forward_full(self, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tp.leader:
            self.tp.check_followers()
            send(self.tp, FULL, torch.as_tensor(token_ids, dtype=torch.int64))
        return super().forward_full(token_ids)

    def stats(self) -> dict:
        self.tp.check_followers()
        return {**super().stats(), "tp": self.tp.size}

    def close_group(self) -> None:
        """Rank 0: tell the followers to return from `follow` (best effort; they also leave with this process)."""
        if self.tp.leader and all(p.exitcode is None for p in self.tp.followers):
            try:
                send(self.tp, STOP)
            except TPError:
                pass


_CLASSES: dict[type, type] = {}


def tp_engine_class(base: type) -> type:
    """`base` (an EmbeddedEngine class) with `TensorParallelEngine` mixed in."""
    if base not in _CLASSES:
        _CLASSES[base] = type(f"TensorParallel{base.__name__}", (TensorParallelEngine, base), {})
    return _CLASSES[base]


@torch.inference_mode()
def follow(engine) -> None:
    """A follower's life after its engine is built: run each step rank 0 broadcasts until it says stop or leaves
    (its process exited: the control group's connection closed)."""
    group = engine.tp
    while True:
        try:
            command, body, tokens, rows = receive(group)
        except TPError as e:
            logger.info("rank 0 left (%s); leaving", e)
            return
        if command == STOP:
            return
        if command == STEP:
            engine._run_model(apply_step(body, tokens, rows, engine))  # noqa: SLF001 (the step rank 0 runs)
        elif command == EMBED:
            engine.embed(body)
        elif command == FULL:
            engine.forward_full(body)
        else:
            raise TPError(f"unknown tensor-parallel command {command}")
