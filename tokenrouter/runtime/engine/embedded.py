"""`EmbeddedEngine`: the default engine, pure PyTorch, CPU and GPU (see `base.py` for the contract).

Per step (`forward`): validate every row first (nothing changes when a row is refused), make room (evict
held requests least-recently-used until the step's new KV slots and request rows fit; if even that is not
enough, run the batch in two halves), allocate, build one `ForwardBatch`, run the model (which writes
the new tokens' slots into the request-to-token table first), and record the new tokens. A request evicted while held keeps its token
history on the host; its next step re-prefills history + new tokens, which gives the same logits.

The model step itself is `_run_model`: when a graph runner is installed (`self.graph_runner`, built by
`cuda_graph_runner.CudaGraphRunner(engine)` on CUDA) and `graph_runner.can_run(forward_batch)`, it returns
`graph_runner.replay(forward_batch)` -> (logits [B, V], hidden [B, H]), and the graph writes the
request-to-token table itself; otherwise the batch moves to the device, the table is written
(`write_req_to_token`), then the attention backend's `init_forward_metadata` and the eager
`model(forward_batch)`. With a graph runner the batch is built on the host only: a step that replays a
graph copies its inputs to the device once (the runner's staging), not twice. A graph runner may read `engine.model`,
`engine.attn_backend`, `engine.req_to_token_pool`, `engine.token_to_kv_pool`, `engine.max_batch`,
`engine.device`, `engine.dtype`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tokenrouter.runtime.engine import kernel_loads
from tokenrouter.runtime.engine.attention import AttentionConfig, create_attention_backend
from tokenrouter.runtime.engine.base import EngineError, ModelInfo, StepInput
from tokenrouter.runtime.engine.compile_ahead import Ahead, compile_ahead
from tokenrouter.runtime.engine.config import EngineTuning, ModelConfig, check_model_folder, load_model_config
from tokenrouter.runtime.engine.eager_warm import EagerWarmUp
from tokenrouter.runtime.engine.forward_batch import ForwardBatch, write_req_to_token
from tokenrouter.runtime.engine.held import HeldRequestsEngine
from tokenrouter.runtime.engine.memory_pool import MHATokenToKVPool, ReqToTokenPool
from tokenrouter.runtime.engine.models import build_empty, init_dummy_weights, load_weights
from tokenrouter.runtime.engine.models.decoder import DecoderForCausalLM
from tokenrouter.runtime.engine.scoring import score, score_plan

if TYPE_CHECKING:
    from tokenrouter.runtime.engine.parallel import TPGroup

logger = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
CPU_DEFAULT_KV_BYTES = 256 << 20
CPU_DEFAULT_MAX_TOKENS = 65536
GPU_KV_FRACTION = 0.8  # of the memory free after the weights, when no budget is given
CPU = torch.device("cpu")
Progress = Callable[[str, str], None]  # (phase, detail): a phase of the engine's start-up, done


def _silent(phase: str, detail: str) -> None:
    pass


@dataclass(slots=True)
class EngineConfig:
    """Settings of one embedded engine (validated; every field may come from a user)."""

    device: str = "cpu"
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on CUDA
    max_tokens: int | None = None  # KV token slots; else from mem_bytes
    mem_bytes: int | None = None  # KV budget in bytes; else a default per device
    max_batch: int = 256  # rows per model forward (larger steps run in pieces)
    max_reqs: int | None = None  # request rows (running + held); default 2 * max_batch
    max_len: int | None = None  # longest sequence; default the model's max_position_embeddings
    load: str = "auto"  # "auto" (safetensors) | "dummy" (random weights on the device)
    attention: str = "auto"
    cuda_graph: bool | None = None  # None: on CUDA when the graph runner is available
    graph_rows: int | None = None  # the widest step the CUDA graphs should hold (default: the runner's)
    seed: int = 0  # for dummy weights
    tuning: EngineTuning = field(default_factory=EngineTuning)  # the GPU fast path's (validated itself)

    def __post_init__(self) -> None:
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"bad device {self.device!r}") from e
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("max_tokens", "mem_bytes", "max_reqs", "max_len", "graph_rows"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"max_batch must be a positive int, got {self.max_batch!r}")
        if self.load not in ("auto", "dummy"):
            raise ValueError(f"load must be 'auto' or 'dummy', got {self.load!r}")
        if self.max_tokens is not None and self.mem_bytes is not None:
            raise ValueError("give max_tokens or mem_bytes, not both")
        if not isinstance(self.tuning, EngineTuning):
            raise ValueError(f"tuning must be an EngineTuning, got {type(self.tuning).__name__}")


@dataclass(slots=True)
class Req:
    """One request as the engine sees it: its whole token history and, while resident, its KV."""

    rid: str
    token_ids: list[int] = field(default_factory=list)
    kv_len: int = 0  # tokens of token_ids whose KV is in the pool (a prefix)
    req_pool_idx: int = 0  # row in req_to_token; 0 = not resident (new or evicted)
    slots: list[int] = field(default_factory=list)  # its KV slot ids (host copy), in sequence order


class EmbeddedEngine(EagerWarmUp, HeldRequestsEngine):
    # whether the start-up builds the eager steps' kernels (`_start`) by running them in the constructor:
    # not on a tensor-parallel rank, whose steps the leader drives once the group is formed
    eager_built_at_start = True

    def __init__(
        self,
        model: DecoderForCausalLM,
        config: ModelConfig,
        settings: EngineConfig,
        name: str,
        progress: Progress | None = None,
        also_build: Callable[[EmbeddedEngine], None] | None = None,
    ) -> None:
        """`progress(phase, detail)`, where given, hears of each phase of the construction as it is done: the
        KV pool allocated ("kv"), the start-up's Triton kernels built ("kernels"), the CUDA graphs captured
        ("graphs"). `also_build(engine)`: another start-up phase's launches, run where this engine builds its
        own kernels ahead (`_start`); it runs inside the constructor, so it may read the model and `info` only."""
        progress = progress or _silent
        self.model = model
        self.model_config = config
        self.settings = settings
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.max_batch = settings.max_batch
        self._init_pools()
        progress("kv", self._kv_summary())
        self._init_attention()
        self.info = self._model_info(name)
        self._init_requests()
        self.ahead = Ahead()  # the Triton kernels `_start` built ahead of the start-up's launches
        self._init_graph_runner()
        if self.graph_runner is not None:
            self._start(progress, also_build)

    def _start(self, progress: Progress, also_build) -> None:
        """Build, in one parallel block (`compile_ahead`), the Triton kernels of every launch the start-up will
        make: the CUDA graphs' forwards, the eager steps of `warm_eager`, and `also_build`'s (the route
        kernel's, from `load_model_runtime`); then capture the graphs. One block rather than one per phase:
        a phase of a few kernels waits for its slowest build with most threads idle, and the builds of the
        phases overlap."""
        runner, parts = self.graph_runner, ["graph shapes"]
        with compile_ahead(self.device) as self.ahead:
            if self.ahead.active:
                runner.build_pass()
                if self.eager_built_at_start:
                    self._eager_build_pass()
                    parts.append("eager steps")
                if also_build is not None:
                    also_build(self)
                    parts.append("route kernel")
        if self.ahead.active:
            progress("kernels", f"{self.ahead.describe()} ({', '.join(parts)})")
        kernel_loads.install()  # the capture's own builds: none where the block built every kernel it launches
        before = kernel_loads.LOADS.snapshot()
        runner.capture(build_ahead=not self.ahead.active)
        progress("graphs", self._graphs_summary(kernel_loads.LOADS.since(before)[0]))

    def _model_info(self, name: str) -> ModelInfo:
        config = self.model_config
        return ModelInfo(
            name=name,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            max_len=self.max_len,
            eos_token_ids=config.eos_token_ids,
            dtype=self.dtype,
            device=self.device,
            logits_dtype=self.dtype,
            scores_prompts=True,
        )

    def _kv_summary(self) -> str:
        pool = self.token_to_kv_pool
        per = pool.bytes_per_token(pool.dtype, pool.head_num, pool.head_dim, pool.layer_num)
        return f"KV pool of {pool.size:,} tokens ({pool.size * per / (1 << 20):,.0f} MiB)"

    def _graphs_summary(self, loads: int) -> str:
        runner = self.graph_runner
        ahead = f" ({runner.ahead.describe()})" if runner.ahead.active else ""
        return (f"{len(runner.graphs)} CUDA graphs captured in {runner.capture_seconds:.1f} s, {loads} Triton "
                f"kernel load(s){ahead}")  # fmt: skip

    # --- construction -----------------------------------------------------------------------------
    def _init_pools(self) -> None:
        c, s = self.model.config, self.settings  # the model's own shape: one rank's share of the KV heads
        size = s.max_tokens if s.max_tokens is not None else self._budget_tokens()
        self.max_len = min(s.max_len or c.max_position_embeddings, c.max_position_embeddings, size)
        self.token_to_kv_pool = MHATokenToKVPool(
            size, self.dtype, c.num_key_value_heads, c.head_dim, c.num_hidden_layers, self.device
        )
        self.req_to_token_pool = ReqToTokenPool(s.max_reqs or 2 * s.max_batch, self.max_len, self.device)

    def _budget_tokens(self) -> int:
        """KV slots for the memory budget (the settings', else a share of the free memory), at most what
        every request row filled to max_len could use; EngineError when it holds none."""
        c, s = self.model.config, self.settings
        budget = s.mem_bytes
        if budget is None and self.device.type == "cuda":
            budget = int(self._free_device_memory() * GPU_KV_FRACTION)
        elif budget is None:
            budget = CPU_DEFAULT_KV_BYTES
        size = MHATokenToKVPool.size_for_budget(
            budget, self.dtype, c.num_key_value_heads, c.head_dim, c.num_hidden_layers
        )
        if s.mem_bytes is None and self.device.type != "cuda":
            size = min(size, CPU_DEFAULT_MAX_TOKENS)
        # never more slots than every request row filled to max_len could use
        max_len = min(s.max_len or c.max_position_embeddings, c.max_position_embeddings)
        size = min(size, (s.max_reqs or 2 * s.max_batch) * max_len)
        if size < 1:
            per = MHATokenToKVPool.bytes_per_token(
                self.dtype, c.num_key_value_heads, c.head_dim, c.num_hidden_layers
            )
            raise EngineError(f"a KV budget of {budget} bytes holds no token ({per} bytes per token)")
        return size

    def _free_device_memory(self) -> int:
        """Bytes free on the device for the KV pool (a tensor-parallel engine: the least of its ranks')."""
        return torch.cuda.mem_get_info(self.device)[0]

    def _init_attention(self) -> None:
        c = self.model.config  # the heads this process computes (all of them, or one rank's share)
        attn_cfg = AttentionConfig(
            num_heads=c.num_attention_heads,
            num_kv_heads=c.num_key_value_heads,
            head_dim=c.head_dim,
            scaling=c.scaling,
            num_layers=c.num_hidden_layers,
            dtype=self.dtype,
            device=self.device,
            hidden_size=c.hidden_size,
            tuning=self.settings.tuning,
        )
        try:
            self.attn_backend = create_attention_backend(self.settings.attention, attn_cfg)
        except ValueError as e:
            raise EngineError(str(e)) from e
        self.model.attn_backend = self.attn_backend

    def _init_graph_runner(self) -> None:
        self.graph_runner = None
        want = self.settings.cuda_graph
        if want is False or (want is None and self.device.type != "cuda"):
            return
        if self.device.type != "cuda":
            raise EngineError("CUDA graphs need a CUDA device")
        if not getattr(self.attn_backend, "supports_cuda_graph", False):
            if want:
                raise EngineError(
                    f"CUDA graphs need the triton attention backend, not {self.attn_backend.name!r}"
                )
            return
        try:
            from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner
        except ImportError as e:
            if want:
                raise EngineError(f"CUDA graphs are not available: {e}") from e
            return
        try:
            config = CudaGraphConfig.for_rows(self.settings.graph_rows)
            self.graph_runner = CudaGraphRunner(self, config, capture=False)  # captured by `_start`
        except ValueError as e:  # e.g. an attention backend that cannot be captured
            if want:
                raise EngineError(f"CUDA graphs are not available: {e}") from e

    # --- the Engine contract ------------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.model.model.embed_tokens(token_ids.to(self.device, torch.int64))

    def forward_full(self, token_ids: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced logits [T, V] and hidden [T, H] of one sequence, without the KV cache."""
        return self.model.forward_full(torch.as_tensor(token_ids, dtype=torch.int64))

    # --- HeldRequestsEngine hooks ---------------------------------------------------------------------
    def _new_req(self, rid: str) -> Req:
        return Req(rid)

    def _resident(self, req: Req) -> bool:
        return req.req_pool_idx != 0

    def _kv_available(self) -> int:
        return self.token_to_kv_pool.available_size()

    def _pages_total(self) -> int:
        return self.token_to_kv_pool.size

    def _extra_stats(self) -> dict:
        return {"attention": self.attn_backend.name, "cuda_graph": self.graph_runner is not None}

    # --- one step -------------------------------------------------------------------------------------
    def _free_kv(self, req: Req) -> None:
        if req.slots:
            self.token_to_kv_pool.free(torch.tensor(req.slots, dtype=torch.int64))
        self.req_to_token_pool.free(req.req_pool_idx)
        self.lru.pop(req.rid, None)
        req.slots, req.kv_len, req.req_pool_idx = [], 0, 0

    def _forward_fitting(
        self, rows: list[StepInput], reqs: list[Req], need_tokens: int, want_hidden: bool
    ) -> tuple[torch.Tensor, torch.Tensor, int]:  # the model always yields the hidden state
        locs = self.token_to_kv_pool.alloc_extend(need_tokens)
        fresh: list[Req] = []  # rows that got a request row in this step
        news, input_ids, prefix_lens, extend_lens, pool_idx = self._step_tokens(rows, reqs, fresh)
        fb = ForwardBatch.build(
            input_ids=input_ids,
            out_cache_loc=locs,
            req_pool_indices=pool_idx,
            extend_prefix_lens=prefix_lens,
            extend_seq_lens=extend_lens,
            device=self.device if self.graph_runner is None else CPU,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
        )
        plan = score_plan(rows, input_ids, extend_lens)
        try:
            logits, hidden = self._run_model(fb) if plan is None else self._run_model(fb, plan.positions)
        except BaseException:
            self._undo_step(locs, fresh)
            raise
        self._commit_step(news, reqs, extend_lens, locs)
        if plan is not None:  # the scored positions' logits follow the rows' last ones
            self.scored.update(score(plan, logits[len(rows) :]))
            logits, hidden = logits[: len(rows)], hidden[: len(rows)]
        return logits, hidden, fb.num_tokens

    def _step_tokens(self, rows: list[StepInput], reqs: list[Req], fresh: list[Req]) -> tuple[list, ...]:
        """(each row's new tokens, the step's input ids, prefix lengths, extend lengths, request rows). A
        request without a request row gets one (and goes into `fresh`) and runs its whole sequence again."""
        input_ids: list[int] = []
        prefix_lens: list[int] = []
        extend_lens: list[int] = []
        pool_idx: list[int] = []
        news: list[list[int]] = []
        for row, req in zip(rows, reqs, strict=True):
            new = row.new_token_ids
            new = new if type(new) is list and all(type(t) is int for t in new) else [int(t) for t in new]
            news.append(new)
            if req.req_pool_idx:
                tokens = new
            else:
                req.req_pool_idx = self.req_to_token_pool.alloc()
                fresh.append(req)
                if req.token_ids:
                    self.reprefills += 1
                tokens = req.token_ids + new
            input_ids.extend(tokens)
            prefix_lens.append(req.kv_len)
            extend_lens.append(len(tokens))
            pool_idx.append(req.req_pool_idx)
        return news, input_ids, prefix_lens, extend_lens, pool_idx

    def _undo_step(self, locs: torch.Tensor, fresh: list[Req]) -> None:
        """Give back a failed step's KV slots and the request rows it took."""
        self.token_to_kv_pool.free(locs)
        for req in fresh:
            self.req_to_token_pool.free(req.req_pool_idx)
            req.req_pool_idx = 0
            req.kv_len = 0

    def _commit_step(
        self, news: list[list[int]], reqs: list[Req], extend_lens: list[int], locs: torch.Tensor
    ) -> None:
        """Record a step's tokens and KV slots on its requests, most recently used last."""
        slot_ids = locs.tolist()
        start = 0
        lru = self.lru
        for new, req, n in zip(news, reqs, extend_lens, strict=True):
            req.slots.extend(slot_ids[start : start + n])
            start += n
            req.token_ids.extend(new)
            req.kv_len = len(req.token_ids)
            self.reqs[req.rid] = req
            lru[req.rid] = None
            lru.move_to_end(req.rid)

    @torch.inference_mode()
    def _run_model(
        self, fb: ForwardBatch, extra: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's last-position logits and hidden states; with `extra` (token indices, scoring.py) those
        tokens' after them, in an eager step."""
        graphs = self.graph_runner if extra is None else None
        shape = graphs.shape_for(fb) if graphs is not None else None
        if shape is not None:
            return graphs.replay(fb, shape)  # copies of the graph's outputs: the caller's own
        fb = fb.to(self.device)
        write_req_to_token(fb)
        self.attn_backend.init_forward_metadata(fb)
        if extra is not None:
            fb.last_indices = torch.cat([fb.last_indices, extra.to(self.device)])
        return self.model(fb)


def resolve_dtype(name: str | None, device: torch.device, config: ModelConfig) -> torch.dtype:
    if name is not None:
        return DTYPES[name]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _indexed_cuda(device) -> torch.device | None:
    """`device` (a torch.device, its name or None) when it names one CUDA device by index, else None."""
    dev = torch.device(device) if device is not None else None
    return dev if dev is not None and dev.type == "cuda" and dev.index is not None else None


def make_current(device) -> None:
    """Make a CUDA device with an index the process's current device. Triton launches its kernels on the
    current device's stream and `torch.cuda.graph` captures the current stream, whatever device the tensors
    are on, so an engine on cuda:1 (a model placed on GPU 1) must also be the current device, or its kernels
    and graphs land on GPU 0's stream. One engine per process (each subserver is one)."""
    if (dev := _indexed_cuda(device)) is not None:
        torch.cuda.set_device(dev)


def device_scope(device) -> contextlib.AbstractContextManager:
    """The CUDA device `device` current for a `with` block, or nothing for a CPU device, an index-less one
    or None: for one process that steps engines on two GPUs (the in-process executor)."""
    dev = _indexed_cuda(device)
    return torch.cuda.device(dev) if dev is not None else contextlib.nullcontext()


def load_engine(
    path: str | Path,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    max_tokens: int | None = None,
    mem_bytes: int | None = None,
    load: str = "auto",
    attention: str = "auto",
    max_batch: int = 256,
    max_reqs: int | None = None,
    max_len: int | None = None,
    cuda_graph: bool | None = None,
    graph_rows: int | None = None,
    seed: int = 0,
    tuning: EngineTuning | None = None,
    engine_class: type[EmbeddedEngine] | None = None,
    progress: Progress | None = None,
    tp: TPGroup | None = None,
    also_build: Callable[[EmbeddedEngine], None] | None = None,
) -> EmbeddedEngine:
    """Load a model folder into an `EmbeddedEngine`. Raises `ModelFolderError` (an EngineError) naming the
    path for a missing or malformed folder, ValueError for bad settings. `engine_class`: a subclass of
    EmbeddedEngine to build instead (e.g. the std-serving baseline's prefix-caching engine). `progress(phase,
    detail)` hears of each phase as it is done: the weights loaded ("weights"), then the engine's own. `tp`: this
    process's rank of a tensor-parallel group (`parallel.py`): its share of the model, read from its slice of the
    weights, in the engine class with `TensorParallelEngine` mixed in; every rank calls this at once. `also_build`:
    as the engine's (`EmbeddedEngine.__init__`)."""
    start = time.perf_counter()
    settings = EngineConfig(
        device=device,
        dtype=dtype,
        max_tokens=max_tokens,
        mem_bytes=mem_bytes,
        max_batch=max_batch,
        max_reqs=max_reqs,
        max_len=max_len,
        load=load,
        attention=attention,
        cuda_graph=cuda_graph,
        graph_rows=graph_rows,
        seed=seed,
        tuning=tuning or EngineTuning(),
    )
    config = load_model_config(path)  # the folder and its config.json first, then the weights
    folder = check_model_folder(path, need_weights=load != "dummy")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineError(f"device {device!r} requested but CUDA is not available")
    make_current(dev)
    make, shard, cls = DecoderForCausalLM, None, engine_class or EmbeddedEngine
    if tp is not None:
        from tokenrouter.runtime.engine.models.tp_layers import TPDecoderForCausalLM, read_shard
        from tokenrouter.runtime.engine.parallel import tp_engine_class

        make = functools.partial(TPDecoderForCausalLM, group=tp)
        shard = functools.partial(read_shard, group=tp, config=config)
        cls = functools.partial(tp_engine_class(cls), group=tp)
    model = build_empty(config, dev, resolve_dtype(dtype, dev, config), make)
    if load == "dummy":
        init_dummy_weights(model, seed)
    else:
        load_weights(model, folder, shard)
    if progress is not None:
        what = "random weights made" if load == "dummy" else "weights loaded"
        dtype_name = str(next(model.parameters()).dtype).removeprefix("torch.")
        progress("weights", f"{what} in {time.perf_counter() - start:.1f} s ({dtype_name} on {dev})")
    return cls(model, config, settings, name=folder.resolve().name, progress=progress, also_build=also_build)
