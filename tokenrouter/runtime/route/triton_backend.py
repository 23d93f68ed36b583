"""Launching the rendered Triton route kernel: grid, chunking, workspace."""

from __future__ import annotations

import math

import torch


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


class TritonRoute:
    """Holds the rendered module's kernels and the per-kernel workspace (grown on demand, reused)."""

    def __init__(self, module, device: torch.device, split: int | None, block: int | None) -> None:
        self.module = module
        self.device = device
        self.split = split
        self.block = block
        self.n_slots = len(module.FLOAT_SLOTS)
        self._ws_rows = 0
        self._ws_split = 0
        self._grow(1, 1)
        self._dummy_router = torch.zeros(1, dtype=torch.float32, device=device)
        self._dummy_forced = torch.zeros(1, dtype=torch.int64, device=device)

    def _grow(self, rows: int, split: int) -> None:
        if rows <= self._ws_rows and split <= self._ws_split:
            return
        rows, split = max(rows, self._ws_rows), max(split, self._ws_split)
        self.ws_f = torch.empty(rows * split * 5, dtype=torch.float32, device=self.device)
        self.ws_i = torch.empty(rows * split, dtype=torch.int32, device=self.device)
        self.count = torch.zeros(rows, dtype=torch.int32, device=self.device)  # the kernel resets it
        self._ws_rows, self._ws_split = rows, split

    def config(self, rows: int, vocab: int) -> tuple[int, int, int]:
        """(split, block, num_warps) for a batch."""
        block = self.block or (2048 if self.device.type == "cuda" else 256)
        if self.split is not None:
            split = self.split
        elif self.device.type == "cuda":
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            split = min(_pow2_floor(2 * sms // rows), _pow2_floor(max(1, vocab // block)), 64)
        else:
            split = 1
        return split, block, max(1, min(16, block // 256))  # 8 elements per thread

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
        split, block, warps = self.config(rows, vocab)
        self._grow(rows, split)
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
            self.ws_f, self.ws_i, self.count,
            token, logprob, rule, feats,
            math.log(vocab),
            SPLIT=split, BLOCK=block, SAMPLING=sampling, HAS_FORCED=forced is not None,
            EVAL_RULES=eval_rules, WRITE_FEATURES=write_features, FAST_MATH=dev.type == "cuda",
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
