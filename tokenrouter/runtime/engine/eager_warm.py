"""The eager warm-up of `EmbeddedEngine` (`EagerWarmUp`, a mixin): at start, the steps that no captured CUDA
graph holds are run once on throwaway requests, so that the Triton kernels they need are built (or read from
Triton's disk cache) at start rather than in a served step."""

from __future__ import annotations

import logging
import time

import torch

from tokenrouter.runtime.engine.base import StepInput
from tokenrouter.runtime.engine.compile_ahead import build_ahead
from tokenrouter.runtime.engine.held import HeldRequestsEngine

logger = logging.getLogger(__name__)

# the most tokens of one warm-up step (`warm_eager`): the activations of a step that large stay well inside the
# memory the KV pool leaves free, and the attention's variants that follow the batch size (its KV tile) only
# arise at 32 query rows or fewer per KV head, at most 16 new tokens a row
WARM_MAX_TOKENS = 4096


class EagerWarmUp:
    """`warm_eager` and what it runs, for an engine with `graph_runner`, `max_batch`, `max_len`, `info`, the
    pools, `ahead`, `eager_built_at_start`, `steps` and `device` (`EmbeddedEngine`)."""

    def eager_warm_shapes(self) -> list[tuple[int, ...]]:
        """The steps `warm_eager` runs, as new tokens per row: each kind of step that no captured graph holds
        (none without a graph runner), in the variants Triton builds a kernel for each of:

        - a row longer than the longest captured extend (a long extend or a prefill);
        - extends of more rows than the widest extend graph, at each captured extend length and at 3 (the
          attention's row block, pipelining and early reads follow the rows' new tokens), and at batch sizes
          doubling up to `max_batch` (its KV tile follows how many programs the launch has);
        - decodes of more rows than the widest decode graph, at batch sizes doubling likewise.

        Each at an odd and an even batch size and token count: a step's integer inputs are slices of one
        buffer (`ForwardBatch._device_parts`) at offsets of whole batch sizes and token counts, and Triton
        specializes a pointer on its 16-byte alignment. On the H200 the first version, without these
        variants, left the 0.6B's 18- and 36-row extends of 4 tokens building the attention kernel.
        Only steps the engine can run: rows within `max_batch` and free request rows, prompts within
        `max_len`, tokens within the free KV and at most WARM_MAX_TOKENS a step."""
        gr = self.graph_runner
        if gr is None:
            return []
        q = max((cq for _, cq in gr.extend_shapes), default=1)  # the longest captured extend
        ext_bs = max((cb for cb, _ in gr.extend_shapes), default=0)
        dec_bs = max(gr.decode_bs, default=0)

        def ladder(first: int) -> list[int]:  # first, first + 1, then doubling: odd and even batch sizes
            out, b = [], first
            while b <= self.max_batch:
                out += [b, b + 1]
                b = 2 * b
            return out

        def flipped(rows: tuple[int, ...]) -> list[tuple[int, ...]]:  # the token count's other parity
            return [rows, (*rows[:-1], rows[-1] - 1)] if rows[-1] > 1 else [rows]

        long = [v for rows in ((q + 32,), (q + 32, 2)) for v in flipped(rows)]
        lens = sorted({3, *(cq for _, cq in gr.extend_shapes)})
        wide = [v for n in lens for b in ladder(ext_bs + 1) for v in flipped((n,) * b)] if ext_bs else []
        decode = [(1,) * b for b in ladder(dec_bs + 1)]
        fits = self.max_len - 1  # a prefill row leaves room for one generated token
        budget = min(self.token_to_kv_pool.available_size(), WARM_MAX_TOKENS)
        rows = min(self.max_batch, self.req_to_token_pool.available_size())

        def runs(s: tuple[int, ...]) -> bool:  # eager (also under a custom graph config), and runnable here
            return (
                gr.bucket(len(s), max(s)) is None and len(s) <= rows and max(s) <= fits and sum(s) <= budget
            )

        shapes = [s for s in long + wide + decode if runs(s)]
        return shapes + self._attention_variant_shapes(shapes, runs, rows, min(fits, budget))

    def _attention_variant_shapes(self, shapes: list, runs, rows: int, longest: int) -> list[tuple[int, ...]]:
        """A step for each attention launch variant (the Triton backend's `launch_variant`) that an eager step
        can make and `shapes` leave out: its longest row first, then decodes, tried at the backend's
        `variant_steps`. On an H100 the shapes above left a 0.6B step of 5 rows and 70 new tokens (2 KV
        splits) building its attention kernel in a served step (715 ms)."""
        backend = self.attn_backend
        if not hasattr(backend, "launch_variant"):  # a backend without Triton's launch variants
            return []
        seen = {backend.launch_variant(len(s), max(s)) for s in shapes}
        out = []
        for b, n in backend.variant_steps(rows, longest):
            s = (n, *(1,) * (b - 1))
            if runs(s) and (v := backend.launch_variant(b, n)) not in seen:
                seen.add(v)
                out.append(s)
        return out

    def warm_eager(self) -> int:
        """Run each of `eager_warm_shapes` once on throwaway requests (released after; the engine's step count
        is left as it was), so that the Triton kernels a step outside the captured graphs needs are built, or
        read from Triton's disk cache, at start rather than in a served step: on a fresh H200 the 32B's first
        extend of 93 tokens at batch size 3 took 1227 ms instead of about 64, three of its kernels built in it.
        Returns the steps run."""
        shapes = self.eager_warm_shapes()
        steps = self.steps
        debug = logger.isEnabledFor(logging.DEBUG)
        try:
            if not (self.ahead.active and self.eager_built_at_start):  # else built at start (`_start`)
                build_ahead(self.device, self._eager_build_pass)
            for k, lens in enumerate(shapes):
                self._warm_step(k, lens, len(shapes), debug)
        finally:
            self.steps = steps
        return len(shapes)

    def _eager_build_pass(self) -> None:
        """`warm_eager`'s steps inside an open `compile_ahead` block: their Triton kernels built, in parallel
        (no step reads what a kernel writes)."""
        steps, shapes = self.steps, self.eager_warm_shapes()
        try:
            for k, lens in enumerate(shapes):
                self._warm_step(k, lens, len(shapes), False)
        finally:
            self.steps = steps

    def _warm_step(self, k: int, lens: tuple[int, ...], total: int, debug: bool) -> None:
        """`warm_eager`'s step `k` of `total`: rows of `lens` new tokens, released after."""
        vocab = self.info.vocab_size
        rows = [
            StepInput(f"warm-up {k}.{i}", [(7 * j + i) % vocab for j in range(n)]) for i, n in enumerate(lens)
        ]
        t0, before = time.perf_counter(), self._alloc_counts() if debug else None
        try:  # the plain engine's step and release: a subclass's bookkeeping (a prefix cache) stays out
            HeldRequestsEngine.forward(self, rows)
        finally:
            for r in rows:
                HeldRequestsEngine.release(self, r.rid)
        # each step's time, and the device allocator's work in it (cudaMalloc, cudaFree, retries)
        if debug:
            after = self._alloc_counts()
            logger.debug("eager warm-up step %d/%d: %d rows, %d new tokens (longest %d): %.1f ms; "
                         "allocator +%d mallocs, +%d frees, +%d retries", k + 1, total, len(lens),
                         sum(lens), max(lens), (time.perf_counter() - t0) * 1e3,
                         *(a - b for a, b in zip(after, before, strict=True)))  # fmt: skip

    def _alloc_counts(self) -> tuple[int, int, int]:
        """The device caching allocator's (device mallocs, device frees, retries after a failed malloc) so far
        (zeros on CPU)."""
        if self.device.type != "cuda":
            return (0, 0, 0)
        torch.cuda.synchronize(self.device)
        st = torch.cuda.memory_stats(self.device)
        return st.get("num_device_alloc", 0), st.get("num_device_free", 0), st.get("num_alloc_retries", 0)
