"""Launching the rendered Triton route kernel: grid, tiles, workspace."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tokenrouter.runtime.sampling import SAMPLE_CHUNK, SAMPLE_GROUP

TILE_BYTES = 16384  # logits bytes per tile and program on a GPU (4096 fp32 / 8192 bf16 values)
SAMPLED_TILE = 4096  # at most this many values per tile when rows sample: the extra sums would spill the
# register budget of two programs per SM (sm_90 build: 221 registers at 8192 bf16 values, 120 at 4096)


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(slots=True)
class LaunchOptions:
    """How `TritonRoute` launches the route kernel. None = `TritonRoute.config`'s choice.

    `split`: programs per row; `block`: logits per tile (a power-of-two multiple of SAMPLE_CHUNK); `warps`.
    `prefetch`: tiles loaded ahead in registers (0: each tile loaded at the top of its own step; 1: the next
    tile's load issued before this tile's reductions, the default; 2: two ahead, more registers).
    `stages`: > 0 asks Triton's software pipeliner for that many stages on the tile loop (loads through
    shared memory with cp.async; it pipelines the loop only with prefetch 0).
    `prefetch` and `stages` leave the results the same bit for bit; `split`, `block` and `warps` change the
    summation order."""

    split: int | None = None
    block: int | None = None
    warps: int | None = None
    prefetch: int = 1
    stages: int = 0

    def __post_init__(self) -> None:
        b = self.block
        if b is not None and (b < SAMPLE_CHUNK or b % SAMPLE_CHUNK or b & (b - 1)):
            raise ValueError(f"block must be a power of two multiple of {SAMPLE_CHUNK}, got {b}")
        if self.split is not None and (self.split < 1 or self.split & (self.split - 1)):
            raise ValueError(f"split must be a power of two >= 1, got {self.split}")
        if self.warps is not None and self.warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"warps must be a power of two from 1 to 32, got {self.warps}")
        if self.prefetch not in (0, 1, 2):
            raise ValueError(f"prefetch must be 0, 1 or 2 tiles, got {self.prefetch}")
        if not 0 <= self.stages <= 8:
            raise ValueError(f"stages must be 0 (Triton's default) to 8, got {self.stages}")


class TritonRoute:
    """Holds the rendered module's kernels and the per-kernel workspace (grown on demand, reused).

    `split`, `block` and `warps` (and the other fields of `LaunchOptions`, by keyword) override the defaults
    of `config`; `options` may be replaced between calls (benchmarks compare launch variants that way)."""

    def __init__(
        self,
        module,
        device: torch.device,
        split: int | None,
        block: int | None,
        warps: int | None = None,
        **options,
    ) -> None:
        self.options = LaunchOptions(split=split, block=block, warps=warps, **options)
        self.module = module
        self.device = device
        self.n_slots = len(module.FLOAT_SLOTS)
        self._ws = (0, 0, 0)
        self._grow(1, 1, 1)
        self._dummy_router = torch.zeros(1, dtype=torch.float32, device=device)
        self._dummy_forced = torch.zeros(1, dtype=torch.int64, device=device)

    def _grow(self, rows: int, split: int, chunk_floats: int) -> None:
        """`chunk_floats`: the sampler's workspace per row ("cdf": the chunk table, 2 x NC; "strided": each
        program's chunk masses, split x SAMPLE_CHUNK / SAMPLE_GROUP)."""
        want = (rows, split, chunk_floats)
        if all(a <= b for a, b in zip(want, self._ws, strict=True)):
            return
        rows, split, chunk_floats = (max(a, b) for a, b in zip(want, self._ws, strict=True))
        self.ws_f = torch.empty(rows * split * 4, dtype=torch.float32, device=self.device)
        self.ws_i = torch.empty(rows * split, dtype=torch.int32, device=self.device)
        self.ws_c = torch.empty(rows * chunk_floats, dtype=torch.float32, device=self.device)
        self.count = torch.zeros(rows, dtype=torch.int32, device=self.device)  # the kernel resets it
        self._ws = (rows, split, chunk_floats)

    def config(
        self, rows: int, vocab: int, itemsize: int = 4, sampling: bool = False
    ) -> tuple[int, int, int]:
        """(split, block, num_warps) for a batch: tiles of TILE_BYTES (at most SAMPLED_TILE values when rows
        sample), made smaller (down to SAMPLE_CHUNK) while a row has fewer tiles than the programs wanted per
        row (about 2 per SM in all)."""
        opt = self.options
        on_gpu = self.device.type == "cuda"
        block = TILE_BYTES // itemsize if not sampling else min(TILE_BYTES // itemsize, SAMPLED_TILE)
        block = opt.block or (max(SAMPLE_CHUNK, block) if on_gpu else SAMPLE_CHUNK)
        if opt.split is not None:
            split = opt.split
        elif on_gpu:
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            want = min(_pow2_floor(2 * sms // rows), 64)
            while opt.block is None and block > SAMPLE_CHUNK and vocab // block < want:
                block //= 2
            split = max(1, min(want, _pow2_floor(vocab // block)))
        else:
            split = 1
        return split, block, opt.warps or 8

    def variants(self, max_rows: int, vocab: int, itemsize: int) -> list[tuple[int, bool]]:
        """(rows, sampling): one batch for each launch configuration (`config`) that a step of 1 to `max_rows`
        rows takes, greedy and sampling. Each is a Triton build of its own the first time a process launches
        it (the row count itself is not specialized: the template's `do_not_specialize`)."""
        seen: dict[tuple, int] = {}
        for sampling in (False, True):
            for rows in range(1, max_rows + 1):
                seen.setdefault((sampling, *self.config(rows, vocab, itemsize, sampling)), rows)
        return [(rows, key[0]) for key, rows in seen.items()]

    def run(
        self,
        logits: torch.Tensor,
        state,
        router_out: torch.Tensor | None,
        forced: torch.Tensor | None,
        *,
        sampling: bool,
        eval_rules: bool,
        write_features: bool,
    ):
        rows, vocab = logits.shape
        split, block, warps = self.config(rows, vocab, logits.element_size(), sampling)
        n_chunks = _pow2_ceil(math.ceil(vocab / SAMPLE_CHUNK))
        per_row = 2 * n_chunks if self.module.SAMPLER == "cdf" else split * (SAMPLE_CHUNK // SAMPLE_GROUP)
        self._grow(rows, split, per_row if sampling else 1)
        chunk = math.ceil(math.ceil(vocab / split) / block) * block
        dev = logits.device
        token = torch.empty(rows, dtype=torch.int64, device=dev)
        logprob = torch.empty(rows, dtype=torch.float32, device=dev)
        if eval_rules:  # the kernel writes every row's rule
            rule = torch.empty(rows, dtype=torch.int32, device=dev)
        else:
            rule = torch.full((rows,), -1, dtype=torch.int32, device=dev)
        feats = torch.empty((max(1, self.n_slots), rows), dtype=torch.float32, device=dev)
        routers = router_out.contiguous() if router_out is not None else self._dummy_router
        n_routers = router_out.shape[1] if router_out is not None else 1
        self.module.route_kernel[(rows, split)](
            logits, logits.stride(0), vocab, chunk, rows,
            state.seed, state.position, state.temperature,
            forced if forced is not None else self._dummy_forced, state.run_length, state.generated,
            routers, n_routers,
            self.ws_f, self.ws_i, self.ws_c, self.count,
            token, logprob, rule, feats,
            math.log(vocab),
            SPLIT=split, BLOCK=block, SC=SAMPLE_CHUNK, NC=n_chunks, SG=SAMPLE_GROUP, SAMPLING=sampling,
            HAS_FORCED=forced is not None, EVAL_RULES=eval_rules, WRITE_FEATURES=write_features,
            FAST_MATH=dev.type == "cuda", PREFETCH=self.options.prefetch, STAGES=self.options.stages,
            num_warps=warps,
        )  # fmt: skip
        return token, logprob, rule, feats

    def rules(self, token, logprob, feats, state, router_out: torch.Tensor | None) -> torch.Tensor:
        rows = token.shape[0]
        rule = torch.full((rows,), -1, dtype=torch.int32, device=token.device)
        routers = router_out.contiguous() if router_out is not None else self._dummy_router
        n_routers = router_out.shape[1] if router_out is not None else 1
        self.module.rules_kernel[(rows,)](
            token, logprob, feats, rows, state.seed, state.position, state.run_length, state.generated,
            routers, n_routers, rule, num_warps=1,
        )  # fmt: skip
        return rule
