"""The route kernel as measured at commit d6f8f70 (docs/benchmarks.md, "Route kernels (issue 4)"), kept so
that route_kernel_bench.py can time it beside the current kernel in the same run: its template
(`triton_route_v1.py.j2`: per-element online softmax, per-lane top-2 and argmax, a Gumbel draw per
vocabulary entry) rendered with the current op macros, and its launcher. Benchmark use only; its sampled
tokens follow the old sampler (Gumbel-max over the whole vocabulary), not tokenrouter.runtime.sampling."""

from __future__ import annotations

import math
from pathlib import Path

import jinja2
import torch

from tokenrouter.compiler.kernels import check_route_ir
from tokenrouter.compiler.kernels import render as _render
from tokenrouter.runtime.route.loader import load_source


def render_v1(ir: dict) -> str:
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader([jinja2.FileSystemLoader(str(Path(__file__).parent)),
                                    jinja2.PackageLoader("tokenrouter.compiler.kernels", "templates")]),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        autoescape=False,
    )  # fmt: skip
    env.filters.update(_render._environment().filters)
    spec = check_route_ir(ir)
    return env.get_template("triton_route_v1.py.j2").render(
        spec=spec, operands=_render._operands(spec, "triton"),
        router_index={n: i for i, n in enumerate(spec.routers)}, float_slots=_render.float_slots(spec),
    )  # fmt: skip


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


class KernelV1:
    """`kernel(logits, state) -> (token, logprob, rule)` with the d6f8f70 launcher's defaults (block 2048,
    8 warps, split = min(2 * SMs / rows, V / block, 64)); no routers, no top-k/top-p rows."""

    def __init__(self, ir: dict, device: str = "cuda") -> None:
        self.module = load_source(render_v1(ir), "v1_" + ir["model"])
        self.device = torch.device(device)
        self.rows = 0

    def config(self, rows: int, vocab: int) -> tuple[int, int, int]:
        block = 2048
        if self.device.type != "cuda":
            return 2, block, 8
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        split = min(_pow2_floor(2 * sms // rows), _pow2_floor(max(1, vocab // block)), 64)
        return split, block, 8

    def __call__(self, logits: torch.Tensor, state):
        rows, vocab = logits.shape
        split, block, warps = self.config(rows, vocab)
        if rows > self.rows:
            self.ws_f = torch.empty(rows * 64 * 5, dtype=torch.float32, device=self.device)
            self.ws_i = torch.empty(rows * 64, dtype=torch.int32, device=self.device)
            self.count = torch.zeros(rows, dtype=torch.int32, device=self.device)
            self.dummy = torch.zeros(1, dtype=torch.int64, device=self.device)
            self.dummy_f = torch.zeros(1, dtype=torch.float32, device=self.device)
            self.rows = rows
        chunk = math.ceil(math.ceil(vocab / split) / block) * block
        token = torch.empty(rows, dtype=torch.int64, device=self.device)
        logprob = torch.empty(rows, dtype=torch.float32, device=self.device)
        rule = torch.empty(rows, dtype=torch.int32, device=self.device)
        feats = torch.empty((max(1, len(self.module.FLOAT_SLOTS)), rows), dtype=torch.float32,
                            device=self.device)  # fmt: skip
        self.module.route_kernel[(rows, split)](
            logits, logits.stride(0), vocab, chunk, rows,
            state.seed, state.position, state.temperature, self.dummy, state.run_length, state.generated,
            self.dummy_f, 1, self.ws_f, self.ws_i, self.count, token, logprob, rule, feats,
            math.log(vocab), SPLIT=split, BLOCK=block, SAMPLING=bool(state.any_sampling), HAS_FORCED=False,
            EVAL_RULES=True, WRITE_FEATURES=False, FAST_MATH=self.device.type == "cuda", num_warps=warps,
        )  # fmt: skip
        return token, logprob, rule
