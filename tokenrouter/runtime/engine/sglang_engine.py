"""`SGLangEngine`: the Engine seam (`base.py`) on SGLang's model runner, kernels, KV pools and CUDA graphs.

All SGLang-specific code of TokenRouter lives in this one module, and SGLang is imported only inside it, when
an engine is built: without SGLang, everything else works and asking for `engine: "sglang"` raises an
`EngineError` that names the model and says how to install it. Pinned to SGLang `SGLANG_VERSION` (0.5.17, the
release built for torch 2.11); a version bump touches this file only.

## The seam: SGLang's `ModelRunner`, driven one ragged step at a time
SGLang's own scheduler is bypassed; TokenRouter's subserver scheduler stays in charge. This engine builds one
SGLang `ModelRunner` (the object SGLang's TP worker owns: weights, `ReqToTokenPool`, the token-to-KV pool and its
allocator, the attention backend, the decode CUDA graphs) the way SGLang's `benchmark/one_batch.py` does, and per
`forward` it
1. allocates KV slots for the step's new tokens from SGLang's `token_to_kv_pool_allocator` and a request row
   from its `req_to_token_pool` for a request seen for the first time,
2. writes `req_to_token[row, positions] = slots` (SGLang's request-to-token table),
3. builds one `ForwardBatch` (`ForwardMode.DECODE` when every row brings one token, so SGLang's decode CUDA
   graphs replay; else `ForwardMode.EXTEND`, a ragged prefill/extend/decode mix, eager) and calls
   `ModelRunner.forward`, which returns SGLang's `LogitsProcessorOutput`: last-position logits per row and,
   with `return_hidden_states_mode="last"`, the last position's final-norm hidden state.
A request that hops away is simply not in the next batch: its row and slots stay in SGLang's pools, and its
return is an extend of the new tokens only. `release` frees both. Sampling stays in TokenRouter.

Why not `sglang.Engine` with sessions and a `custom_logit_processor`: it exposes sampled tokens and logprobs,
not the raw per-step logits and hidden states that the route kernel reads, and every step would be a request
through SGLang's tokenizer manager and scheduler processes (ZMQ hops per token). The runner seam is the one
that gives per-step logits + hidden states for a ragged batch with the KV kept in SGLang's pools. Its cost:
`ModelRunner` / `ForwardBatch` signatures change between SGLang releases (hence the pin and the version check).

Limits (said, not hidden): one SGLang engine per process (SGLang keeps process-wide state: its torch.distributed
group and published server args), tensor parallelism 1, CUDA only, attention backend "triton" (the FA3 default
needs a library the H200 bundle leaves out), page size 1, no prefill/extend CUDA graphs (SGLang's piecewise
prefill graphs compile with torch.compile; extends run eagerly), Qwen3/Qwen2/Llama-family decoders as SGLang
loads them.

Status: verified on CPU against a stand-in runner (tests/engine_sglang/fake_sglang.py), and on the H200 against
SGLang 0.5.17 (docs/sglang.md, "Status"): the contract suite passes, a plan with both models here answers the
OpenAI API, aborts free SGLang's KV. Steps holding an extend run eagerly (no extend graphs), which makes serving
with routing 3.4x slower than on the embedded engine.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tokenrouter.runtime.engine.base import EngineError, ModelInfo, StepInput
from tokenrouter.runtime.engine.config import ModelConfig, check_model_folder, load_model_config
from tokenrouter.runtime.engine.embedded import EngineConfig
from tokenrouter.runtime.engine.held import HeldRequestsEngine
from tokenrouter.runtime.engine.memory_pool import MHATokenToKVPool

logger = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.17"
INSTALL_HINT = (
    f"install it on a CUDA machine with `pip install 'sglang=={SGLANG_VERSION}'`, or unpack the bundle that "
    "shared/device/sglang-bundle.sh builds and put it on PYTHONPATH (see docs/sglang.md)"
)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_GRAPH_MAX_BS = 64  # decode CUDA graphs captured up to this batch size (bigger decodes run eagerly)

_started_in_process: str | None = None  # the model of the one SGLang runner this process holds


def import_sglang(model: str):
    """The `sglang` package at the pinned version, or an EngineError naming `model` that says how to get it."""
    try:
        import sglang
    except ImportError as e:
        raise EngineError(
            f"model {model!r}: engine 'sglang' needs SGLang {SGLANG_VERSION}, which is not installed here "
            f'({e}); {INSTALL_HINT}, or use engine: "embedded"'
        ) from None
    version = getattr(sglang, "__version__", "unknown")
    if version != SGLANG_VERSION:
        raise EngineError(
            f"model {model!r}: engine 'sglang' is written against SGLang {SGLANG_VERSION}, found {version}; "
            f"{INSTALL_HINT}"
        )
    return sglang


@dataclass(slots=True)
class SGLangSettings(EngineConfig):
    """Settings of one SGLang engine: the embedded engine's (validated the same way), with SGLang's defaults
    and its own memory knob. `max_tokens` unset: from `mem_bytes`, else SGLang's own sizing; `load="dummy"`:
    SGLang's random weights; `cuda_graph` None/True: SGLang's decode CUDA graphs, False: eager."""

    device: str = "cuda:0"
    mem_fraction_static: float | None = None  # SGLang's share of the GPU for weights + KV (None: its default)

    def __post_init__(self) -> None:
        EngineConfig.__post_init__(self)
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"engine 'sglang': dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attention not in ("auto", "triton"):
            raise ValueError(f"engine 'sglang' supports attention 'triton' only, got {self.attention!r}")
        if self.mem_fraction_static is not None and not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static!r}")
        if self.max_reqs is not None and self.max_reqs < self.max_batch:
            raise ValueError(f"max_reqs ({self.max_reqs}) must be >= max_batch ({self.max_batch})")


@dataclass(slots=True, eq=False)
class Req:
    """One request as the engine sees it: its token history and, while resident, its SGLang row and slots.
    `req_pool_idx` is the attribute SGLang's `ReqToTokenPool.alloc/free` read and write (None: not resident)."""

    rid: str
    token_ids: list[int] = field(default_factory=list)
    kv_len: int = 0  # tokens of token_ids whose KV is in SGLang's pool (a prefix)
    req_pool_idx: int | None = None  # its slots are req_to_token[req_pool_idx, :kv_len] (as in SGLang)


class SGLangEngine(HeldRequestsEngine):
    """The Engine contract over one SGLang `ModelRunner` (see the module docstring)."""

    def __init__(self, runner, config: ModelConfig, settings: SGLangSettings, name: str, sgl) -> None:
        self.runner = runner
        self.model_config = config
        self.settings = settings
        self._sgl = sgl  # the SGLang names this engine uses per step
        kind = str(runner.device)  # SGLang's ModelRunner: "cuda" and its gpu_id
        self.device = torch.device(f"{kind}:{runner.gpu_id}" if kind == "cuda" else kind)
        self.dtype = runner.dtype
        self.max_batch = min(settings.max_batch, runner.req_to_token_pool.size)
        self.req_to_token_pool = runner.req_to_token_pool
        self.allocator = runner.token_to_kv_pool_allocator
        self.pages_total = self.allocator.available_size()
        context = int(getattr(runner.model_config, "context_len", config.max_position_embeddings))
        self.max_len = min(settings.max_len or context, context, self.pages_total)
        self.graphs = getattr(runner, "decode_cuda_graph_runner", None) is not None
        self.info = self._model_info(name)
        self._init_requests()
        self.graph_steps = 0

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
            logits_dtype=torch.float32,  # SGLang's LogitsProcessor casts its logits to float32
        )

    # --- the Engine contract ------------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            layer = self.runner.model.get_input_embeddings()
            return layer(token_ids.to(self.device, torch.int64))

    # --- HeldRequestsEngine hooks ---------------------------------------------------------------------
    def _new_req(self, rid: str) -> Req:
        return Req(rid)

    def _resident(self, req: Req) -> bool:
        return req.req_pool_idx is not None

    def _kv_available(self) -> int:
        return self.allocator.available_size()

    def _pages_total(self) -> int:
        return self.pages_total

    def _counters(self) -> dict[str, int]:
        return {**HeldRequestsEngine._counters(self), "cuda_graph": self.graph_steps}

    def _extra_stats(self) -> dict:
        return {
            "graph_steps": self.graph_steps,
            "attention": "sglang-triton",
            "cuda_graph": self.graphs,
            "sglang": SGLANG_VERSION,
        }

    # --- one step -------------------------------------------------------------------------------------
    def _free_kv(self, req: Req) -> None:
        if req.kv_len:  # a copy: the allocator keeps what it is given
            self.allocator.free(
                self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len].to(torch.int64)
            )
        self.req_to_token_pool.free(req)  # sets req.req_pool_idx = None
        self.lru.pop(req.rid, None)
        req.kv_len = 0

    def _forward_fitting(
        self, rows: list[StepInput], reqs: list[Req], need_tokens: int, want_hidden: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        is_fresh = [q.req_pool_idx is None for q in reqs]
        fresh = [q for q, f in zip(reqs, is_fresh, strict=True) if f]
        if fresh and self.req_to_token_pool.alloc(fresh) is None:
            raise EngineError("SGLang's request pool refused rows that _make_room had freed")
        locs = self.allocator.alloc(need_tokens)
        if locs is None:
            self._undo(fresh, None)
            raise EngineError("SGLang's KV allocator refused slots that _make_room had freed")
        news, step = self._step_tokens(rows, reqs, is_fresh)
        try:
            logits, hidden = self._run(reqs, locs, *step, want_hidden)
        except BaseException:
            self._undo(fresh, locs)
            raise
        for new, req in zip(news, reqs, strict=True):
            req.token_ids.extend(new)
            req.kv_len = len(req.token_ids)
            self.reqs[req.rid] = req
            self.lru[req.rid] = None
            self.lru.move_to_end(req.rid)
        return logits, hidden, len(step[0])

    def _step_tokens(
        self, rows: list[StepInput], reqs: list[Req], is_fresh: list[bool]
    ) -> tuple[list[list[int]], tuple[list[int], ...]]:
        """(each row's new tokens, the step's (input ids, positions, token rows, prefix lengths, extend
        lengths)); a fresh request (a new request row) runs its whole sequence again."""
        news: list[list[int]] = []
        step: tuple[list[int], ...] = ([], [], [], [], [])
        input_ids, positions, token_rows, prefix_lens, extend_lens = step
        for row, req, was_fresh in zip(rows, reqs, is_fresh, strict=True):
            new = [int(t) for t in row.new_token_ids]
            news.append(new)
            if was_fresh:
                if req.token_ids:
                    self.reprefills += 1
                tokens = req.token_ids + new
            else:
                tokens = new
            input_ids.extend(tokens)
            positions.extend(range(req.kv_len, req.kv_len + len(tokens)))
            token_rows.extend([req.req_pool_idx] * len(tokens))
            prefix_lens.append(req.kv_len)
            extend_lens.append(len(tokens))
        return news, step

    def _undo(self, fresh: list[Req], locs: torch.Tensor | None) -> None:
        if locs is not None:
            self.allocator.free(locs)
        for req in fresh:
            if req.req_pool_idx is not None:
                self.req_to_token_pool.free(req)
            req.kv_len = 0

    @torch.inference_mode()
    def _run(self, reqs, locs, input_ids, positions, token_rows, prefix_lens, extend_lens, want_hidden):
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
        host, d = _upload(
            self.device, input_ids, positions, token_rows, reqs, seq_lens, prefix_lens, extend_lens
        )
        out_loc = locs.to(torch.int64)
        self.req_to_token_pool.req_to_token[d["rows"], d["pos"]] = out_loc.to(torch.int32)
        decode = all(e == 1 for e in extend_lens)
        fb = self._forward_batch(reqs, d, out_loc, host[d["seq_at"]], sum(seq_lens), decode, want_hidden)
        if not decode:
            _set_extend(fb, d, prefix_lens, extend_lens)
        result = self.runner.forward(fb)
        out = result.logits_output
        logits = out.next_token_logits[:, : self.model_config.vocab_size]
        hidden = out.hidden_states if want_hidden else None
        if result.can_run_graph:  # graph outputs live in static buffers the next replay overwrites
            self.graph_steps += 1
            logits = logits.clone()
            hidden = None if hidden is None else hidden.clone()
        return logits, hidden

    def _forward_batch(
        self, reqs, d: dict, out_loc, seq_lens_cpu, seq_lens_sum: int, decode: bool, want_hidden
    ):
        """SGLang's ForwardBatch for a step over the uploaded parts `d` (an extend's own fields: `_set_extend`)."""
        sgl = self._sgl
        bs = len(reqs)
        return sgl.ForwardBatch(
            forward_mode=sgl.ForwardMode.DECODE if decode else sgl.ForwardMode.EXTEND,
            batch_size=bs,
            input_ids=d["ids"],
            req_pool_indices=d["pool"],
            seq_lens=d["seq"],
            out_cache_loc=out_loc,
            seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu,
            return_logprob=False,
            spec_algorithm=sgl.SpeculativeAlgorithm.NONE,
            capture_hidden_mode=sgl.CaptureHiddenMode.LAST if want_hidden else sgl.CaptureHiddenMode.NULL,
            positions=d["pos"],
            lora_ids=[None] * bs,
            rids=[r.rid for r in reqs],
            num_token_non_padded_cpu=d["ids"].shape[0],
        )


def _set_extend(fb, d: dict, prefix_lens: list[int], extend_lens: list[int]) -> None:
    """The fields an extend's ForwardBatch adds to a decode's."""
    fb.extend_num_tokens = d["ids"].shape[0]
    fb.extend_seq_lens = d["ext"].to(torch.int32)
    fb.extend_prefix_lens = d["prefix"].to(torch.int32)
    fb.extend_start_loc = d["start"].to(torch.int32)
    fb.extend_seq_lens_cpu = list(extend_lens)
    fb.extend_prefix_lens_cpu = list(prefix_lens)
    fb.extend_logprob_start_lens_cpu = list(extend_lens)


def _upload(dev, input_ids, positions, token_rows, reqs, seq_lens, prefix_lens, extend_lens):
    """(the host tensor, its device copy's parts by name): one host->device copy for everything a step needs.
    `seq_at`: the slice of the host tensor holding the sequence lengths."""
    bs, num_tokens = len(reqs), len(input_ids)
    starts = [0] * bs
    for i in range(1, bs):
        starts[i] = starts[i - 1] + extend_lens[i - 1]
    host = torch.tensor(
        input_ids + positions + token_rows + [r.req_pool_idx for r in reqs] + seq_lens
        + prefix_lens + extend_lens + starts,
        dtype=torch.int64,
    )  # fmt: skip
    packed = host.to(dev, non_blocking=True)
    o = 3 * num_tokens
    n = num_tokens
    parts = {"ids": packed[:n], "pos": packed[n : 2 * n], "rows": packed[2 * n : o]}
    for i, name in enumerate(("pool", "seq", "prefix", "ext", "start")):
        parts[name] = packed[o + i * bs : o + (i + 1) * bs]
    parts["seq_at"] = slice(o + bs, o + 2 * bs)
    return host, parts


class _SGLangNames:
    """The SGLang classes one step uses, imported once (keeps `_run` free of imports)."""

    def __init__(self) -> None:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.ForwardBatch = ForwardBatch
        self.ForwardMode = ForwardMode
        self.CaptureHiddenMode = CaptureHiddenMode
        self.SpeculativeAlgorithm = SpeculativeAlgorithm


def _kv_tokens(settings: SGLangSettings, config: ModelConfig) -> int | None:
    if settings.max_tokens is not None:
        return settings.max_tokens
    if settings.mem_bytes is None:
        return None
    per = MHATokenToKVPool.bytes_per_token(
        DTYPES[settings.dtype or "bfloat16"],
        config.num_key_value_heads,
        config.head_dim,
        config.num_hidden_layers,
    )
    tokens = settings.mem_bytes // per
    if tokens < 1:
        raise EngineError(f"a KV budget of {settings.mem_bytes} bytes holds no token ({per} bytes per token)")
    return tokens


def server_args_kwargs(folder: Path, settings: SGLangSettings, config: ModelConfig, gpu_id: int) -> dict:
    """SGLang `ServerArgs` for one model run through its ModelRunner (no SGLang import: tests check the names)."""
    max_reqs = settings.max_reqs or 2 * settings.max_batch
    kw = dict(
        model_path=str(folder),
        skip_tokenizer_init=True,
        load_format="dummy" if settings.load == "dummy" else "auto",
        dtype=settings.dtype or "bfloat16",
        attention_backend="triton",
        page_size=1,
        tp_size=1,
        base_gpu_id=gpu_id,
        random_seed=settings.seed,
        max_running_requests=max_reqs,
        disable_radix_cache=True,
        return_hidden_states_mode="last",
        disable_prefill_cuda_graph=True,
        log_level="error",
    )
    kw.update(_sized_args(settings, config, max_reqs))
    return kw


def _sized_args(settings: SGLangSettings, config: ModelConfig, max_reqs: int) -> dict:
    """The `ServerArgs` the settings size: KV tokens, context length, memory fraction, decode graphs."""
    kw = {}
    tokens = _kv_tokens(settings, config)
    if tokens is not None:
        kw["max_total_tokens"] = tokens
    if settings.max_len is not None and settings.max_len <= config.max_position_embeddings:
        kw["context_length"] = settings.max_len
    if settings.mem_fraction_static is not None:
        kw["mem_fraction_static"] = settings.mem_fraction_static
    if settings.cuda_graph is False:
        kw["disable_cuda_graph"] = True
    else:
        kw["cuda_graph_max_bs_decode"] = min(settings.max_batch, max_reqs, DEFAULT_GRAPH_MAX_BS)
    return kw


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_args(folder: Path, settings: SGLangSettings, config: ModelConfig, gpu_id: int):
    """SGLang's `ServerArgs` for the model, with the process-wide settings SGLang derives from them applied."""
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(**server_args_kwargs(folder, settings, config, gpu_id))
    _set_envs_and_config(server_args)
    initialize_moe_config(server_args)
    initialize_fp8_gemm_config(server_args)
    initialize_fp4_gemm_config(server_args)
    return server_args


def _start_runner(folder: Path, settings: SGLangSettings, config: ModelConfig, gpu_id: int):
    """Build SGLang's ModelRunner for one model (weights, pools, attention backend, decode CUDA graphs)."""
    from sglang.srt.configs.model_config import ModelConfig as SGLModelConfig
    from sglang.srt.distributed.parallel_state_wrapper import ParallelState
    from sglang.srt.model_executor.model_runner import ModelRunner

    server_args = _server_args(folder, settings, config, gpu_id)
    runner = ModelRunner(
        model_config=SGLModelConfig.from_server_args(server_args),
        mem_fraction_static=server_args.mem_fraction_static,
        gpu_id=gpu_id,
        ps=ParallelState.trivial(gpu_id=gpu_id),
        nccl_port=_free_port(),  # its torch.distributed group of one (PortArgs would also make IPC temp files)
        server_args=server_args,
    )
    runner.alloc_memory_pool()
    runner.init_attention_backends()
    runner.init_cuda_graphs()
    return runner


def load_sglang_engine(
    path: str | Path,
    *,
    model: str | None = None,
    device: str = "cuda:0",
    dtype: str | None = None,
    max_tokens: int | None = None,
    mem_bytes: int | None = None,
    load: str = "auto",
    attention: str = "auto",
    max_batch: int = 256,
    max_reqs: int | None = None,
    max_len: int | None = None,
    cuda_graph: bool | None = None,
    seed: int = 0,
    mem_fraction_static: float | None = None,
) -> SGLangEngine:
    """Load a model folder into an `SGLangEngine` (same keywords as `embedded.load_engine`, plus `model`, the
    plan's name for it, used in errors). Raises EngineError when SGLang is absent or the wrong version, when
    there is no CUDA device, when the folder is unusable, or when SGLang fails to start; ValueError for bad
    settings."""
    global _started_in_process
    settings = SGLangSettings(
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
        seed=seed,
        mem_fraction_static=mem_fraction_static,
    )
    name = model or Path(path).resolve().name
    import_sglang(name)  # first: without SGLang nothing else about this model matters
    config = load_model_config(path)
    folder = check_model_folder(path, need_weights=load != "dummy")
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise EngineError(f"model {name!r}: engine 'sglang' needs a CUDA device (asked for {device!r})")
    if _started_in_process is not None:
        raise EngineError(
            f"model {name!r}: this process already runs SGLang for {_started_in_process!r}; SGLang keeps "
            "process-wide state, so each SGLang model needs its own process (one subserver per model does this)"
        )
    gpu_id = dev.index if dev.index is not None else torch.cuda.current_device()
    if max_tokens is None and mem_bytes is None and mem_fraction_static is None:
        logger.warning(
            "model %s: no KV budget (plan option mem): SGLang sizes its KV pool to most of the GPU's free "
            "memory, leaving little for other models on the same GPU",
            name,
        )
    try:
        runner = _start_runner(folder, settings, config, gpu_id)
    except EngineError:
        raise
    except Exception as e:
        logger.exception("SGLang failed to start for model %s", name)
        raise EngineError(
            f"model {name!r}: SGLang {SGLANG_VERSION} failed to start: {type(e).__name__}: {e}"
        ) from e
    _started_in_process = name
    return SGLangEngine(runner, config, settings, name, _SGLangNames())
