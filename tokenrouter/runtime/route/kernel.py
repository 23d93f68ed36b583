"""`RouteKernel`: a model's sampling-and-routing step, rendered from the plan's route IR at start."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tokenrouter.compiler.kernels import RouteIRError, check_route_ir, render_route_kernel
from tokenrouter.runtime.engine import compile_ahead
from tokenrouter.runtime.route.loader import load_source
from tokenrouter.runtime.route.routers import (
    Router,
    RouterFileError,
    RouterSpec,
    load_router,
    model_hidden_size,
)
from tokenrouter.runtime.sampling import DEFAULT_SAMPLER, SAMPLERS, sample, seed_to_int64

_U64, _TWO63, _TWO64 = 2**64 - 1, 2**63, 2**64


@functools.lru_cache(maxsize=1024)
def _pack_layout(rows: int) -> tuple[struct.Struct, int]:
    """`RouteBatchState.pack`'s buffer for `rows` rows: four int64, two float32 and one int32 column, each
    `stride` = rows rounded up to a multiple of 4 values long (pad bytes between), so each starts at a
    multiple of 16 bytes."""
    stride = -(-rows // 4) * 4
    pad8, pad4 = f"{8 * (stride - rows)}x", f"{4 * (stride - rows)}x"
    return struct.Struct("=" + f"{rows}q{pad8}" * 4 + f"{rows}f{pad4}" * 2 + f"{rows}i{pad4}"), stride


def _check_pack_lengths(seed, position, temperature, top_k, top_p, run_length, generated) -> int:
    """The row count of `RouteBatchState.pack`'s columns (ValueError when they differ in length)."""
    rows = len(position)
    cols = (seed, temperature, top_k, top_p, run_length, generated)
    if any(len(c) != rows for c in cols):
        raise ValueError(f"RouteBatchState.pack: columns differ in length ({[rows, *map(len, cols)]})")
    return rows


def _pack_into(layout: struct.Struct, buf, seed, position, temperature, top_k, top_p, run_length, generated):
    """Write the columns into `buf` in `_pack_layout`'s order (seeds as signed int64; ValueError naming a
    value out of its column's range)."""
    seeds = [int(x or 0) & _U64 for x in seed]
    seeds = [x - _TWO64 if x >= _TWO63 else x for x in seeds]
    try:
        layout.pack_into(buf, 0, *seeds, *position, *run_length, *generated, *temperature, *top_p, *top_k)
    except (struct.error, OverflowError) as exc:
        raise ValueError(f"RouteBatchState.pack: a value out of its column's range ({exc})") from None


def _column_views(dev: torch.Tensor, rows: int, stride: int) -> tuple[torch.Tensor, ...]:
    """The seven columns of a packed byte buffer: seed, position, run_length, generated (int64),
    temperature, top_p (float32), top_k (int32)."""
    i64 = dev[: 32 * stride].view(torch.int64).view(4, stride)[:, :rows]
    f32 = dev[32 * stride : 40 * stride].view(torch.float32).view(2, stride)[:, :rows]
    return (*i64.unbind(), *f32.unbind(), dev[40 * stride : 40 * stride + 4 * rows].view(torch.int32))


class RouteKernelError(ValueError):
    """A plan, model or input the route kernel cannot serve. The message is for users."""


@dataclass(slots=True)
class RouteBatchState:
    """Per-row sampling and counter state of one step, tensors [B] on the kernel's device.

    `position` is the index of the token being sampled (prompt length + tokens committed before it);
    `run_length` and `generated` count tokens committed BEFORE this one (the kernel adds 1, docs/ir.md).
    `any_sampling` / `any_restricted` are optional host-side hints (does any row have temperature > 0 /
    top-k or top-p active?); None = find out from the tensors, which costs a device sync.
    """

    seed: torch.Tensor  # int64 (the 64-bit seed's bit pattern)
    position: torch.Tensor  # int64
    temperature: torch.Tensor  # float32, 0 = greedy
    top_k: torch.Tensor  # int32, 0 = off
    top_p: torch.Tensor  # float32, 1 = off
    run_length: torch.Tensor  # int64
    generated: torch.Tensor  # int64
    any_sampling: bool | None = None
    any_restricted: bool | None = None

    @classmethod
    def make(
        cls,
        rows: int,
        device: torch.device | str = "cpu",
        *,
        seed=0,
        position=0,
        temperature=0.0,
        top_k=0,
        top_p=1.0,
        run_length=0,
        generated=0,
    ) -> RouteBatchState:
        """Build a state from scalars or per-row sequences (for engines, tools and tests). The host-side
        hints are filled in from the host values, so the kernel never syncs to find them. A seed of None
        counts as 0; seeds may be given as unsigned 64-bit values."""

        def col(value, dtype):
            t = torch.as_tensor(value, dtype=dtype)
            return (t.expand(rows) if t.dim() == 0 else t).contiguous()

        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * rows
        host = dict(
            seed=torch.tensor([seed_to_int64(int(x or 0)) for x in seeds], dtype=torch.int64),
            position=col(position, torch.int64),
            temperature=col(temperature, torch.float32),
            top_k=col(top_k, torch.int32),
            top_p=col(top_p, torch.float32),
            run_length=col(run_length, torch.int64),
            generated=col(generated, torch.int64),
        )
        for name, value in host.items():
            if value.shape != (rows,):
                raise ValueError(f"RouteBatchState.make: {name} has {value.shape[0]} values for {rows} rows")
        hot = host["temperature"] > 0
        restricted = hot & ((host["top_k"] > 0) | (host["top_p"] < 1))
        return cls(**{k: v.to(device) for k, v in host.items()}, any_sampling=bool(hot.any()),
                   any_restricted=bool(restricted.any()))  # fmt: skip

    @classmethod
    def pack(
        cls,
        device: torch.device | str,
        *,
        seed: Sequence[int | None],
        position: Sequence[int],
        temperature: Sequence[float],
        top_k: Sequence[int],
        top_p: Sequence[float],
        run_length: Sequence[int],
        generated: Sequence[int],
    ) -> RouteBatchState:
        """The same state as `make` for per-row Python values (the scheduler writes the same bytes into
        buffers it keeps: `route.state.RouteStatePacker`), built with one host-to-device copy: every column
        goes into one host byte buffer (`struct`, native byte order: int64 seed, position, run_length,
        generated | float32 temperature, top_p | int32 top_k), which is copied once and viewed on the device
        as the seven columns. `make` instead copies each column on its own (seven copies; on CUDA each
        pageable copy costs ~10-20 µs of host time). Every column starts at a multiple of 16 bytes, like a
        tensor of its own (Triton specialises pointer arguments on that: other offsets would compile other
        kernel variants). The hints are computed from the Python values."""
        rows = _check_pack_lengths(seed, position, temperature, top_k, top_p, run_length, generated)
        layout, stride = _pack_layout(rows)
        buf = bytearray(layout.size)
        _pack_into(layout, buf, seed, position, temperature, top_k, top_p, run_length, generated)
        host = torch.frombuffer(buf, dtype=torch.uint8) if rows else torch.empty(0, dtype=torch.uint8)
        dev = host.to(device, non_blocking=True)  # one copy (pageable memory: safe to drop `buf` after)
        return cls.from_columns(_column_views(dev, rows, stride), temperature, top_k, top_p)

    @classmethod
    def from_columns(
        cls,
        views: tuple[torch.Tensor, ...],
        temperature: Sequence[float],
        top_k: Sequence[int],
        top_p: Sequence[float],
    ) -> RouteBatchState:
        """The state of `_column_views`' seven tensors, with the hints from the Python values."""
        seed_t, position_t, run_length_t, generated_t, temperature_t, top_p_t, top_k_t = views
        hot = [t > 0 for t in temperature]
        return cls(
            seed=seed_t,
            position=position_t,
            temperature=temperature_t,
            top_k=top_k_t,
            top_p=top_p_t,
            run_length=run_length_t,
            generated=generated_t,
            any_sampling=any(hot),
            any_restricted=any(h and (k > 0 or p < 1) for h, k, p in zip(hot, top_k, top_p, strict=True)),
        )


@dataclass(slots=True)
class RouteResult:
    token: torch.Tensor  # int64 [B]
    logprob: torch.Tensor  # float32 [B]
    rule: torch.Tensor  # int32 [B], index of the fired rule, -1 = stay
    features: dict[str, torch.Tensor] | None = None  # with_features=True: name -> [B] (routers by name)


class RouteKernel:
    """The route kernel of one model of a plan.

    `RouteKernel(plan, model, backend, device, embed=None)` renders the model's route IR with jinja2 (never
    code from the plan), loads the routers its block reads (safetensors, shape-checked) and is then called
    once per step: `kernel(logits [B, V], hidden [B, H] | None, state) -> RouteResult`.
    `backend`: "torch" (reference, CPU/GPU), "triton" (fused, CUDA; on CPU only under TRITON_INTERPRET=1)
    or "auto" (triton on CUDA when importable, else torch). `embed(token_ids [B]) -> [B, H]` is needed when a
    router reads `embedding(MODEL, token)`. `hidden_size` overrides the one read from the model's config.json;
    `split`, `block` and `warps` override the Triton launch configuration (`TritonRoute.config`).
    `sampler`: the two-stage draw of temperature sampling (`tokenrouter.runtime.sampling.SAMPLERS`;
    DEFAULT_SAMPLER, "strided", is also the engines' and `sample`'s, so a seed gives the same tokens on every
    path; "cdf" is the alternative). Both renderers and the top-k / top-p path use it.
    """

    def __init__(
        self,
        plan: dict,
        model: str,
        backend: str = "auto",
        device: torch.device | str = "cpu",
        embed: Callable[[torch.Tensor], torch.Tensor] | None = None,
        *,
        hidden_size: int | None = None,
        split: int | None = None,
        block: int | None = None,
        warps: int | None = None,
        sampler: str = DEFAULT_SAMPLER,
    ) -> None:
        if sampler not in SAMPLERS:
            raise RouteKernelError(f"unknown sampler {sampler!r}; expected one of {', '.join(SAMPLERS)}")
        self.model = model
        self.sampler = sampler
        self.device = torch.device(device)
        self.embed = embed
        self._init_spec(plan, model)
        self.backend = self._init_backend(backend)
        self.source = render_route_kernel(self.spec, self.backend, sampler=sampler)
        self.module = load_source(self.source, f"{self.backend}_{model}")
        self._init_routers(plan, hidden_size)
        self._triton = None
        if self.backend == "triton":
            from tokenrouter.runtime.route.triton_backend import TritonRoute

            self._triton = TritonRoute(self.module, self.device, split, block, warps)

    # --- construction steps ---
    def _init_spec(self, plan: dict, model: str) -> None:
        routes = plan.get("routes") if isinstance(plan, dict) else None
        if not isinstance(routes, dict) or model not in routes:
            known = ", ".join(sorted(routes)) if isinstance(routes, dict) else "none"
            raise RouteKernelError(f"the plan has no route block for model {model!r} (models: {known})")
        try:
            self.spec = check_route_ir(routes[model], model)
        except RouteIRError as exc:
            raise RouteKernelError(str(exc)) from None

    def _init_backend(self, backend: str) -> str:
        if backend not in ("auto", "torch", "triton"):
            raise RouteKernelError(f"unknown backend {backend!r}; expected auto, torch or triton")
        if backend == "torch":
            return backend
        import os

        interpret = os.environ.get("TRITON_INTERPRET") == "1"
        try:
            import triton  # noqa: F401
        except ImportError:
            if backend == "triton":
                raise RouteKernelError("backend 'triton' needs the triton package") from None
            return "torch"
        if self.device.type == "cuda" or (backend == "triton" and interpret):
            return "triton"
        if backend == "triton":
            raise RouteKernelError(
                "backend 'triton' needs a CUDA device (or TRITON_INTERPRET=1 for the interpreter)"
            )
        return "torch"

    def _init_routers(self, plan: dict, hidden_size: int | None) -> None:
        entries = plan.get("routers") or {}
        self.routers: list[Router] = []
        self.hidden_size = hidden_size
        if self.hidden_size is None and self.spec.routers:
            self.hidden_size = self._model_hidden_size(plan)
        for name in self.spec.routers:
            rspec = self._router_spec(name, entries)
            router, implied = load_router(rspec, self.hidden_size, self.device)  # RouterFileError passes up
            self.hidden_size = self.hidden_size or (implied or None)
            self.routers.append(router)
        kinds = {i.kind for r in self.routers for i in r.spec.inputs}
        self.needs_hidden = "hidden" in kinds
        self.needs_token_first = "embedding" in kinds
        if self.needs_token_first and self.embed is None:
            raise RouteKernelError(
                f"a router of {self.model!r} reads embedding(token); the engine must pass `embed`"
            )

    def _router_spec(self, name: str, entries: dict) -> RouterSpec:
        """The plan's entry of a router the route block reads, which must read this model only."""
        if name not in entries:
            raise RouteKernelError(
                f"route block of {self.model!r} reads router {name!r}, which the plan lacks"
            )
        try:
            rspec = RouterSpec.from_plan(name, entries[name])
        except ValueError as exc:
            raise RouteKernelError(str(exc)) from None
        others = {i.model for i in rspec.inputs} - {self.model}
        if others:
            raise RouteKernelError(f"router {name!r} reads model(s) {sorted(others)}, not {self.model!r}")
        return rspec

    def _model_hidden_size(self, plan: dict) -> int | None:
        """The model's hidden size from its config.json (None where the plan gives no path)."""
        model_entry = (plan.get("models") or {}).get(self.model) or {}
        path = model_entry.get("path")
        if not isinstance(path, str):
            return None
        try:
            return model_hidden_size(path)
        except ValueError as exc:
            raise RouteKernelError(str(exc)) from None

    # --- one step ---
    def __call__(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor | None,
        state: RouteBatchState,
        *,
        with_features: bool = False,
        forced: torch.Tensor | None = None,
    ) -> RouteResult:
        """`forced` [B] int64: per row, a token to take instead of the kernel's own draw (-1: draw), e.g. one
        drawn under a grammar's mask (runtime/grammar.py); the features, routers and rules read the logits as
        given, with the forced token as the row's token (its log-probability under them)."""
        self._check_inputs(logits, hidden, state)
        if logits.shape[0] == 0:
            empty = torch.empty(0, dtype=torch.int64, device=logits.device)
            return RouteResult(empty, empty.float(), empty.int(), {} if with_features else None)
        sampling, restricted = _hints(state)
        if self.backend == "torch":
            return self._run_torch(logits, hidden, state, sampling, restricted, with_features, forced)
        if restricted:  # the separate top-k / top-p path: the one sampler, for the rows that restrict
            forced = self._restricted_draw(logits, state, forced)
        return self._run_triton(logits, hidden, state, forced, sampling, with_features)

    def _restricted_draw(self, logits: torch.Tensor, state: RouteBatchState, forced: torch.Tensor | None):
        """`forced` with the draws of the rows that sample under top-k / top-p (and are not forced already)."""
        rows = (state.temperature > 0) & ((state.top_k > 0) | (state.top_p < 1))
        if forced is not None:
            rows &= forced < 0
        tok = sample(logits, state.temperature, state.top_k, state.top_p, state.seed, state.position,
                     sampler=self.sampler)  # fmt: skip
        return torch.where(rows, tok, torch.full_like(tok, -1) if forced is None else forced)

    def warm(
        self,
        max_rows: int,
        vocab: int,
        dtype: torch.dtype,
        hidden_size: int | None = None,
        build_ahead: bool = True,
    ) -> int:
        """Launch the Triton route kernel once in each launch variant that a step of 1 to `max_rows` rows of
        `dtype` logits can take (`TritonRoute.variants`): greedy without and with forced tokens (a grammar's),
        sampling, and sampling with top-k (the forced tokens of the separate sampler). Triton builds each
        variant the first time a process launches it, about half a second where the machine has not built it
        before (then from its disk cache); warmed at start, no serving step waits for one. `build_ahead`: first build them all in parallel
        (`build_pass` in a `compile_ahead` block of its own; off where the caller's block has run `build_pass`).
        Returns the launches, 0 on the torch backend. The results are dropped; the workspace is left grown to
        `max_rows`."""
        found = self._warm_inputs(max_rows, vocab, dtype, hidden_size)
        if found is None:
            return 0
        variants, logits, hidden = found
        if build_ahead:
            compile_ahead.build_ahead(self.device, lambda: self._build_launches(variants, logits, hidden))
        launches, draw = 0, torch.full((logits.shape[0],), -1, dtype=torch.int64, device=self.device)
        for rows, state, force in self._warm_batches(variants):  # forced -1: every row draws its own token
            self(
                logits[:rows],
                hidden[:rows] if hidden is not None else None,
                state,
                forced=draw[:rows] if force else None,
            )
            launches += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return launches

    def build_pass(
        self, max_rows: int, vocab: int, dtype: torch.dtype, hidden_size: int | None = None
    ) -> None:
        """`warm`'s launches inside a `compile_ahead` block that the caller holds open (the engine's start-up,
        `load_model_runtime`): their Triton kernels built, nothing run."""
        found = self._warm_inputs(max_rows, vocab, dtype, hidden_size)
        if found is not None:
            self._build_launches(*found)

    def _warm_inputs(self, max_rows: int, vocab: int, dtype: torch.dtype, hidden_size: int | None):
        """(launch variants, logits, hidden or None) of `warm`, or None on the torch backend."""
        tr = self._triton
        if tr is None or max_rows < 1:
            return None
        variants = tr.variants(max_rows, vocab, torch.empty((), dtype=dtype).element_size())
        top = max(rows for rows, _ in variants)
        gen = torch.Generator(device=self.device).manual_seed(0)
        logits = torch.randn((top, vocab), generator=gen, device=self.device, dtype=dtype)
        width = self.hidden_size or hidden_size
        if self.needs_hidden and not width:
            raise RouteKernelError(
                f"the route block of {self.model!r} reads hidden(): warming it needs the model's hidden size"
            )
        hidden = torch.zeros((top, width), device=self.device, dtype=dtype) if self.needs_hidden else None
        return variants, logits, hidden

    def _build_launches(self, variants, logits: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """`warm`'s launches with every Triton launch building only (inside a `compile_ahead` block): the route
        kernel in each variant (a top-k row's token comes forced, from the separate sampler), and the rules
        kernel where the rules read the drawn token. No kernel runs here, so the routers read token 0 where
        `warm`'s would read the drawn one."""
        zero = torch.zeros(logits.shape[0], dtype=torch.int64, device=self.device)
        for rows, state, force in self._warm_batches(variants):
            lg, hd, tok = logits[:rows], hidden[:rows] if hidden is not None else None, zero[:rows]
            sampling, restricted = _hints(state)  # as `__call__` reads them
            self._run_triton(
                lg, hd, state, tok if restricted or force else None, sampling, False, router_token=tok
            )

    def _warm_batches(self, variants):
        """(rows, state, forced) of each of `warm`'s launches: per launch variant, greedy without and with forced
        tokens (a grammar's, runtime/grammar.py: structured output at temperature 0), or sampling without and
        with top-k (the separate sampler's forced tokens, the launch a grammar's take too)."""
        for rows, sampling in variants:
            for top_k, force in ((0, False), (1, False)) if sampling else ((0, False), (0, True)):
                state = RouteBatchState.make(rows, self.device, temperature=float(sampling), top_k=top_k)
                yield rows, state, force

    def _check_inputs(
        self, logits: torch.Tensor, hidden: torch.Tensor | None, state: RouteBatchState
    ) -> None:
        if logits.dim() != 2 or logits.shape[1] < 2:
            raise RouteKernelError(f"logits must be [B, V] with V >= 2, got {list(logits.shape)}")
        if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise RouteKernelError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
        if logits.stride(1) != 1:
            raise RouteKernelError("logits rows must be contiguous")
        rows = logits.shape[0]
        for name in ("seed", "position", "temperature", "top_k", "top_p", "run_length", "generated"):
            value = getattr(state, name)
            if value.shape != (rows,):
                raise RouteKernelError(f"state.{name} must have shape [{rows}], got {list(value.shape)}")
        if self.needs_hidden:
            if hidden is None:
                raise RouteKernelError(
                    f"the route block of {self.model!r} reads hidden(); pass hidden states"
                )
            if hidden.shape[0] != rows or (self.hidden_size and hidden.shape[1] != self.hidden_size):
                raise RouteKernelError(
                    f"hidden must be [{rows}, {self.hidden_size}] (the routers' hidden size), got {list(hidden.shape)}"
                )

    def _features_for_rules(self, f: dict, state: RouteBatchState) -> dict:
        f["run_length"] = state.run_length + 1
        f["generated"] = state.generated + 1
        f["position"] = state.position + 1
        return f

    def _router_out(self, logits: torch.Tensor, hidden: torch.Tensor | None, token: torch.Tensor | None):
        if not self.routers:
            return None
        cache: dict = {}
        cols = []
        for router in self.routers:
            x = torch.cat(
                [self._input_value(i, logits, hidden, token, cache) for i in router.spec.inputs], dim=-1
            )
            cols.append(router(x))
        return torch.stack(cols, dim=1)

    def _input_value(
        self, inp, logits: torch.Tensor, hidden: torch.Tensor | None, token: torch.Tensor | None, cache: dict
    ) -> torch.Tensor:
        """One router input's values [B, width], computed once per step (`cache`) however many routers read it."""
        key = (inp.kind, inp.k)
        if key in cache:
            return cache[key]
        if inp.kind == "hidden":
            out = hidden.float()
        elif inp.kind == "embedding":
            out = self.embed(token).float()
            if out.shape != (logits.shape[0], self.hidden_size or out.shape[1]):
                raise RouteKernelError(
                    f"embed() returned {list(out.shape)}, expected [{logits.shape[0]}, {self.hidden_size}]"
                )
        else:
            if inp.k > logits.shape[1]:
                raise RouteKernelError(f"{inp.text()} asks for more values than the vocabulary has")
            out = logits.float().topk(inp.k, dim=-1).values
            if inp.kind == "topk_logprobs":
                if "lse" not in cache:
                    cache["lse"] = torch.logsumexp(logits.float(), dim=-1, keepdim=True)
                out = out - cache["lse"]
        cache[key] = out
        return out

    def _run_torch(
        self, logits, hidden, state, sampling, restricted, with_features, forced=None
    ) -> RouteResult:
        mod = self.module
        f = mod.route_stats(
            logits,
            state.seed,
            state.position,
            state.temperature,
            state.top_k,
            state.top_p,
            sampling,
            restricted,
        )
        if forced is not None:
            x = logits.float()
            token = torch.where(forced >= 0, forced, f["token"])
            logprob = x.gather(1, token[:, None])[:, 0] - torch.logsumexp(x, dim=-1)
            f["token"], f["logprob"] = token, torch.where(forced >= 0, logprob, f["logprob"])
        router_out = self._router_out(logits, hidden, f["token"])
        f = self._features_for_rules(f, state)
        rule = mod.route_rules(f, router_out, state.seed, state.position)
        return RouteResult(
            f["token"], f["logprob"], rule, self._debug(f, router_out, state) if with_features else None
        )

    def _run_triton(
        self, logits, hidden, state, forced, sampling, with_features, router_token=None
    ) -> RouteResult:
        """`router_token`: the tokens the routers read instead of the drawn ones (`_build_launches`', where
        no kernel draws)."""
        tr = self._triton
        if self.needs_token_first:
            token, logprob, _, feats = tr.run(
                logits, state, None, forced, sampling=sampling, eval_rules=False, write_features=True
            )
            router_out = self._router_out(logits, hidden, token if router_token is None else router_token)
            rule = tr.rules(token, logprob, feats, state, router_out)
        else:
            router_out = self._router_out(logits, hidden, None)
            token, logprob, rule, feats = tr.run(
                logits,
                state,
                router_out,
                forced,
                sampling=sampling,
                eval_rules=True,
                write_features=with_features,
            )
        if not with_features:
            return RouteResult(token, logprob, rule)
        f = {name: feats[i] for i, name in enumerate(self.module.FLOAT_SLOTS)}
        f.update(token=token, logprob=logprob)
        return RouteResult(
            token, logprob, rule, self._debug(self._features_for_rules(f, state), router_out, state)
        )

    def _debug(self, f: dict, router_out, state: RouteBatchState) -> dict:
        from tokenrouter.runtime.rng import STREAM_UNIFORM, uniform

        out = {name: f[name] for name in self.spec.features}
        if self.spec.uses_uniform:
            out["uniform"] = f.get(
                "uniform",
                uniform(state.seed, state.position, STREAM_UNIFORM, torch.zeros_like(state.position)),
            )
        for i, router in enumerate(self.routers):
            out[router.spec.name] = router_out[:, i]
        return out


__all__ = ["RouteBatchState", "RouteKernel", "RouteKernelError", "RouteResult", "RouterFileError"]


def _hints(state: RouteBatchState) -> tuple[bool, bool]:
    """(does any row sample, does any sample under top-k / top-p): the state's host-side hints, else found out
    from its tensors (a device sync)."""
    sampling = state.any_sampling
    if sampling is None:
        sampling = bool((state.temperature > 0).any())
    restricted = state.any_restricted
    if restricted is None:
        restricted = sampling and bool(((state.top_k > 0) | (state.top_p < 1)).any())
    return sampling, restricted
