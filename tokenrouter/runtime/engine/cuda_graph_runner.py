"""`CudaGraphRunner`: the model forward captured in CUDA graphs, for decode batches and for extend batches
of small suffixes (every return of a request from a peer model is such an extend).

A captured shape is (bs, q): bs rows with at most q new tokens each, laid out in static buffers of
T = bs * q tokens. Decode shapes have q = 1; extend shapes q > 1 (they also serve mixed decode/extend
batches). A batch runs in the smallest captured shape that holds it (fewest padded tokens); any other batch
runs eagerly (`can_run` says which).

Padding, as `ForwardBatch` defines it: the real rows come first with their tokens packed from token 0;
each padding row owns one padding token right after them (`req_pool_indices` 0, `seq_lens` 1, position 0,
`out_cache_loc` 0 — the reserved dummy KV slot); tokens left over after that belong to no row (the
attention kernels never read them; their K/V goes to slot 0). Outputs of padding rows are dropped.

A graph also writes the step's new slots into the request-to-token table before the forward
(`forward_batch.write_req_to_token`, from a static per-token row index staged with the inputs): a replayed step
launches nothing but the input copy and the graph. Padding and unowned tokens write slot 0 at row 0,
position 0, which already holds it (row 0 is reserved and all zeros).

The attention backend must declare `supports_cuda_graph` and keep every per-step value it reads inside
the forward in the batch's device tensors (see `attention/triton_backend.py`). All graphs share one memory
pool; they are captured largest first, so the smaller ones reuse its blocks. Before the first, every shape's
forward runs once inside `compile_ahead` (`build_pass`), which builds the Triton kernels of all of them in
parallel; the engine's start-up opens that block itself (`EmbeddedEngine._start`), with the other start-up
phases' kernels in it, and then captures with `build_ahead=False`.

`replay` returns copies of the graph's static outputs (which the next replay overwrites).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tokenrouter.runtime.engine import compile_ahead
from tokenrouter.runtime.engine.forward_batch import ForwardBatch, ForwardMode, write_req_to_token

DEFAULT_DECODE_BS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
DEFAULT_EXTEND_BS = (1, 2, 4, 8, 16)
# A request that comes back from a peer brings every token written while it was away: about 1/p of them
# for a hop rate p (12 at p = 0.1 on the large model), so extends reach well past 8 tokens per row.
DEFAULT_EXTEND_LENS = (2, 4, 8, 16, 32, 64)
DEFAULT_MAX_EXTEND_TOKENS = 512  # extend shapes with bs * q above this are not captured
# batch sizes past the defaults, for plans that run more rows at once (`CudaGraphConfig.for_rows`)
WIDE_BS = (24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass(slots=True)
class CudaGraphConfig:
    decode_batch_sizes: tuple[int, ...] = DEFAULT_DECODE_BS
    extend_batch_sizes: tuple[int, ...] = DEFAULT_EXTEND_BS
    extend_lens: tuple[int, ...] = DEFAULT_EXTEND_LENS  # bucket sizes of new tokens per row (each > 1)
    max_extend_tokens: int = DEFAULT_MAX_EXTEND_TOKENS

    def __post_init__(self) -> None:
        for name in ("decode_batch_sizes", "extend_batch_sizes", "extend_lens"):
            vals = tuple(sorted(set(int(v) for v in getattr(self, name))))
            if any(v < 1 for v in vals):
                raise ValueError(f"cuda graph {name} must be positive integers, got {vals}")
            setattr(self, name, vals)
        if any(q < 2 for q in self.extend_lens):
            raise ValueError("cuda graph extend_lens must be >= 2 (q = 1 is a decode shape)")
        if self.extend_lens and not self.extend_batch_sizes:
            raise ValueError("cuda graph extend_lens given without extend_batch_sizes")

    @classmethod
    def for_rows(cls, rows: int | None) -> CudaGraphConfig:
        """The default shapes, widened so that a step of up to `rows` rows runs in a graph: decodes of that
        many rows, and extends (every mixed step of returns among decodes is one) of that many rows at the
        extend lengths that fit `max_extend_tokens`. At high concurrency a model's steps are wide mixed
        batches of a few returns among many decode rows; past the default widths they would run eagerly."""
        if rows is None:
            return cls()

        def upto(base: tuple[int, ...]) -> tuple[int, ...]:
            wider = [b for b in WIDE_BS if b > base[-1] and b < rows]
            return (*base, *wider, rows) if rows > base[-1] else base

        return cls(upto(DEFAULT_DECODE_BS), upto(DEFAULT_EXTEND_BS))

    def shapes(self) -> list[tuple[int, int]]:
        """Every (bs, q) to capture."""
        out = [(bs, 1) for bs in self.decode_batch_sizes]
        out += [
            (bs, q)
            for bs in self.extend_batch_sizes
            for q in self.extend_lens
            if bs * q <= self.max_extend_tokens
        ]
        return out


ModelForward = Callable[[ForwardBatch], tuple[torch.Tensor, torch.Tensor]]


def _host_views(host: torch.Tensor, t: int, b: int) -> tuple[np.ndarray, ...]:
    """numpy views of a staging buffer: all of it, tokens [4, t], the first four row columns [4, b], indptr,
    last."""
    full = host.numpy()
    r = 4 * t
    return (
        full,
        full[:r].reshape(4, t),
        full[r : r + 4 * b].reshape(4, b),
        full[r + 4 * b : r + 5 * b + 1],
        full[r + 5 * b + 1 :],
    )


def _fit_batch(config: CudaGraphConfig, cap: int) -> CudaGraphConfig:
    """`config` without the batch sizes above `cap`; ValueError when no shape is left."""
    extend_bs = tuple(b for b in config.extend_batch_sizes if b <= cap)
    fitted = CudaGraphConfig(
        tuple(b for b in config.decode_batch_sizes if b <= cap),
        extend_bs,
        config.extend_lens if extend_bs else (),
        config.max_extend_tokens,
    )
    if not fitted.shapes():
        raise ValueError(f"no CUDA graph shape fits max_batch={cap}")
    return fitted


class CudaGraphRunner:
    """Captures the engine's `model(fb) -> (logits [B, V], hidden [B, H])` for every shape of `config`
    (batch sizes above `engine.max_batch` are left out)."""

    def __init__(self, engine, config: CudaGraphConfig | None = None, capture: bool = True) -> None:
        """Captures every shape now, unless `capture` is False (then the caller calls `capture`)."""
        backend = engine.attn_backend
        if not getattr(backend, "supports_cuda_graph", False):
            raise ValueError(f"the {backend.name!r} attention backend cannot run in CUDA graphs")
        self.model: ModelForward = engine.model
        self.attn_backend = backend
        self.req_to_token_pool = engine.req_to_token_pool
        self.token_to_kv_pool = engine.token_to_kv_pool
        self.device = engine.device
        self.config = _fit_batch(config or CudaGraphConfig(), engine.max_batch)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.capture_seconds = 0.0
        self.ahead = compile_ahead.Ahead()  # the kernels `capture` built before its forwards (compile_ahead)
        self.replays_by_shape: dict[tuple[int, int], int] = {}
        self._init_buffers()
        self._init_buckets()
        if capture:
            self.capture()

    # ---- set-up ---------------------------------------------------------------------------------------
    def _init_buffers(self) -> None:
        shapes = self.config.shapes()
        self.max_bs = max(bs for bs, _ in shapes)
        self.max_tokens = max(bs * q for bs, q in shapes)
        t, b = self.max_tokens, self.max_bs
        # one buffer: tokens [4, t] (input_ids | positions | out_cache_loc | each token's request row), then
        # rows (req | seq | prefix | ext | indptr (b+1) | last), so one copy can load a whole step
        self.inputs = torch.zeros(4 * t + 6 * b + 1, dtype=torch.int64, device=self.device)
        self.tok = self.inputs[: 4 * t].view(4, t)
        self.rows = self.inputs[4 * t :]
        # host staging of the same layout, a ring so a copy in flight is never overwritten
        pin = self.device.type == "cuda"
        self._host = [torch.zeros(self.inputs.numel(), dtype=torch.int64, pin_memory=pin) for _ in range(4)]
        self._host_events: list[torch.cuda.Event | None] = [None] * len(self._host)
        self._ring = 0
        self._host_views = [_host_views(h, t, b) for h in self._host]
        # a padding row's req, seq, prefix, ext
        self._pad_rows = np.array([[0], [1], [0], [1]], dtype=np.int64)
        self._arange = np.arange(b + 1, dtype=np.int64)

    def _init_buckets(self) -> None:
        self.decode_bs = list(self.config.decode_batch_sizes)
        self.extend_shapes = sorted(
            ((bs, q) for bs, q in self.config.shapes() if q > 1),
            key=lambda s: (s[0] * s[1], s[1]),
        )

    def _static_batch(self, bs: int, q: int) -> ForwardBatch:
        """A ForwardBatch over the static buffers for shape (bs, q), filled with padding rows."""
        t = bs * q
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE if q == 1 else ForwardMode.MIXED,
            batch_size=bs,
            num_tokens=t,
            input_ids=self.tok[0, :t],
            positions=self.tok[1, :t],
            out_cache_loc=self.tok[2, :t],
            **self._static_rows(bs),
            seq_lens_cpu=(1,) * bs,
            extend_prefix_lens_cpu=(0,) * bs,
            extend_seq_lens_cpu=(1,) * bs,
            max_seq_len=1,
            max_extend_len=q,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
        )
        fb.attn_metadata = self.attn_backend.metadata_for(bs, q)
        fb.token_rows = self.tok[3, :t]
        return fb

    def _static_rows(self, bs: int) -> dict[str, torch.Tensor]:
        """The per-row fields of a static batch of `bs` rows: views of the static `rows` buffer."""
        b = self.max_bs
        req, seq, prefix, ext = (self.rows[i * b : i * b + bs] for i in range(4))
        return dict(
            req_pool_indices=req,
            seq_lens=seq,
            extend_prefix_lens=prefix,
            extend_seq_lens=ext,
            qo_indptr=self.rows[4 * b : 4 * b + bs + 1],
            last_indices=self.rows[5 * b + 1 : 5 * b + 1 + bs],
        )

    def _forward(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """What a graph runs: the request-to-token write, then the model."""
        write_req_to_token(fb, fb.token_rows)
        return self.model(fb)

    def _fill_padding(self, bs: int, t: int) -> None:
        """Every row a padding row: one token each, the rest unowned."""
        b = self.max_bs
        self.tok[:, :t].zero_()
        host = torch.zeros(5 * b + b + 1, dtype=torch.int64)
        host[b : 2 * b] = 1  # seq_lens
        host[3 * b : 4 * b] = 1  # extend_seq_lens
        host[4 * b : 5 * b + 1] = torch.arange(b + 1)  # qo_indptr
        host[5 * b + 1 :] = torch.arange(b)  # last_indices
        self.rows.copy_(host.to(self.device))

    def shapes_largest_first(self) -> list[tuple[int, int]]:
        return sorted(self.config.shapes(), key=lambda s: s[0] * s[1], reverse=True)

    @torch.inference_mode()
    def build_pass(self) -> None:
        """Every shape's forward once, for a `compile_ahead` block that the caller holds open: the launches only
        build their kernels, and nothing read afterwards depends on them (the forwards are capturable)."""
        for bs, q in self.shapes_largest_first():
            self._fill_padding(bs, bs * q)
            self._forward(self._static_batch(bs, q))

    @torch.inference_mode()
    def capture(self, build_ahead: bool = True) -> None:
        """Capture every shape, largest first. `build_ahead`: first build every shape's Triton kernels in
        parallel (`build_pass` in a block of its own; off where the caller's block has built them)."""
        if self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            if build_ahead:  # every shape's kernels at once, in parallel
                self.ahead = compile_ahead.build_ahead(self.device, self.build_pass)
            for bs, q in self.shapes_largest_first():
                fb = self._static_batch(bs, q)
                self._fill_padding(bs, bs * q)
                for _ in range(2):  # warm up: Triton compiles, cuBLAS picks its kernels
                    self._forward(fb)
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    out = self._forward(fb)
                self.graphs[(bs, q)] = graph
                self.outputs[(bs, q)] = out
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - start

    # ---- per step -------------------------------------------------------------------------------------
    def shape_for(self, fb: ForwardBatch) -> tuple[int, int] | None:
        """The captured (bs, q) that runs `fb`, or None (then run it eagerly)."""
        return self.bucket(fb.batch_size, fb.max_extend_len)

    def bucket(self, bs: int, q: int) -> tuple[int, int] | None:
        """The captured (bs, q) that holds a batch of `bs` rows with at most `q` new tokens each, or None."""
        if q == 1:
            i = bisect.bisect_left(self.decode_bs, bs)
            if i < len(self.decode_bs):
                return (self.decode_bs[i], 1)
        for cap_bs, cap_q in self.extend_shapes:  # ordered by padded token count
            if cap_bs >= bs and cap_q >= q:
                return (cap_bs, cap_q)
        return None

    def can_run(self, fb: ForwardBatch) -> bool:
        return self.shape_for(fb) is not None

    def replay(
        self, fb: ForwardBatch, shape: tuple[int, int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run `fb` in its captured shape (`shape`: `shape_for(fb)`, when the caller has it already): logits
        [B, V] and hidden [B, H] (copies the caller owns)."""
        shape = shape or self.shape_for(fb)
        if shape is None:
            raise ValueError(f"no captured CUDA graph holds bs={fb.batch_size}, q={fb.max_extend_len}")
        self.load_batch(fb, shape)
        logits, hidden = self._launch(shape)
        self.replays_by_shape[shape] = self.replays_by_shape.get(shape, 0) + 1
        # copies: the static outputs are overwritten by the next replay, and callers may keep a step's rows
        return logits[: fb.batch_size].clone(), hidden[: fb.batch_size].clone()

    def _launch(self, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        self.graphs[shape].replay()
        return self.outputs[shape]

    def load_batch(self, fb: ForwardBatch, shape: tuple[int, int]) -> None:
        """Copy `fb` into the static buffers of `shape`, padded (see the module doc). With a batch that
        carries its host ints (`ForwardBatch.build` does), the whole step is staged on the host and loaded in one host-to-device copy; else the token
        tensors are copied from the batch's device tensors and the rows from the host."""
        slot = self._next_slot()
        host = self._host[slot]
        if fb.host_ints is not None:
            self._stage_host_ints(fb, self._host_views[slot], shape)
            self.inputs.copy_(host, non_blocking=True)
        else:
            self._stage_by_parts(fb, self._host_views[slot][0], shape)
            self._copy_by_parts(fb, host, shape)
        if self.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record()
            self._host_events[slot] = ev

    def _next_slot(self) -> int:
        """The next staging buffer of the ring, once the copy that last read it has finished."""
        slot = self._ring
        self._ring = (slot + 1) % len(self._host)
        if self._host_events[slot] is not None:
            self._host_events[slot].synchronize()
        return slot

    def _stage_host_ints(
        self, fb: ForwardBatch, views: tuple[np.ndarray, ...], shape: tuple[int, int]
    ) -> None:
        """`load_batch`'s host staging for a batch with `build`'s host ints, laid out as the static buffers
        (ForwardBatch.host_ints): a few block copies, then the padding; only what the shape's graph reads is
        written (other values may be stale)."""
        cap_bs, cap_q = shape
        bs, t, cap_t = fb.batch_size, fb.num_tokens, cap_bs * cap_q
        _, tok, rows4, indptr, last = views
        src = fb.host_ints.numpy()
        tok[:, :t] = src[: 4 * t].reshape(4, t)
        if cap_t > t:
            tok[:, t:cap_t] = 0
        r = 4 * t
        rows4[:, :bs] = src[r : r + 4 * bs].reshape(4, bs)
        r += 4 * bs
        indptr[: bs + 1] = src[r : r + bs + 1]
        last[:bs] = src[r + bs + 1 : r + 2 * bs + 1]
        if cap_bs > bs:  # padding rows: one token each, right after the real ones
            pad = cap_bs - bs
            rows4[:, bs:cap_bs] = self._pad_rows
            np.add(self._arange[1 : pad + 1], t, out=indptr[bs + 1 : cap_bs + 1])
            np.add(self._arange[:pad], t, out=last[bs:cap_bs])

    def _copy_by_parts(self, fb: ForwardBatch, host: torch.Tensor, shape: tuple[int, int]) -> None:
        """`load_batch`'s copies for a batch staged by `_stage_by_parts`: the staged token rows and rows[b:]
        from the host, the token tensors and request rows from the batch's device tensors."""
        cap_bs, cap_q = shape
        bs, t, cap_t, b, big_t = fb.batch_size, fb.num_tokens, cap_bs * cap_q, self.max_bs, self.max_tokens
        fb = fb.to(self.device)
        self.tok[3, :cap_t].copy_(host[3 * big_t : 3 * big_t + cap_t], non_blocking=True)
        self.tok[0, :t].copy_(fb.input_ids)
        self.tok[1, :t].copy_(fb.positions)
        self.tok[2, :t].copy_(fb.out_cache_loc)
        if cap_t > t:
            self.tok[:3, t:cap_t].zero_()
        self.rows[b:].copy_(host[4 * big_t + b :], non_blocking=True)
        self.rows[:bs].copy_(fb.req_pool_indices)
        if cap_bs > bs:
            self.rows[bs:cap_bs].zero_()

    def _stage_by_parts(self, fb: ForwardBatch, full: np.ndarray, shape: tuple[int, int]) -> None:
        """`load_batch`'s host staging for a batch without `build`'s host ints (assembled by hand): each
        token's request row (its rows read from the device: one sync) and rows[b:] from the batch's host
        copies; the token tensors and the request rows are then copied from the batch's device tensors."""
        cap_bs, _ = shape
        bs, t, b, big_t = fb.batch_size, fb.num_tokens, self.max_bs, self.max_tokens
        rows_at = 4 * big_t
        full[3 * big_t : 4 * big_t] = 0
        req_rows = np.asarray(fb.req_pool_indices.tolist(), dtype=np.int64)
        full[3 * big_t : 3 * big_t + t] = np.repeat(req_rows, fb.extend_seq_lens_cpu)
        h = full[rows_at + b :]
        h[:] = 0
        h[0:bs] = fb.seq_lens_cpu
        h[0 + bs : cap_bs] = 1
        h[b : b + bs] = fb.extend_prefix_lens_cpu
        h[2 * b : 2 * b + bs] = fb.extend_seq_lens_cpu
        h[2 * b + bs : 2 * b + cap_bs] = 1
        indptr = h[3 * b : 3 * b + cap_bs + 1]
        np.cumsum(h[2 * b : 2 * b + cap_bs], out=indptr[1:])
        h[4 * b + 1 : 4 * b + 1 + cap_bs] = indptr[1:] - 1  # last_indices
