"""The Triton route kernel under Triton's interpreter against the torch renderer (run as a script, in a
fresh process, with TRITON_INTERPRET=1 set before triton is imported; test_route_triton_interp.py runs it).
Usage: python route_interp_check.py TMPDIR [cpu|cuda] [cdf|strided] (the sampler of both renderers, default
tokenrouter.runtime.sampling.DEFAULT_SAMPLER). Exits non-zero with the first mismatch."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

# only as a script: route_variants_check.py imports `compare` from here and decides for itself (it compiles for
# real with `cuda` among its arguments, whose argv[2] is not this script's device)
if __name__ == "__main__" and (len(sys.argv) < 3 or sys.argv[2] != "cuda"):
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import triton_interp

    triton_interp.install()  # tests/triton_interp.py: one patch of triton.language per kernel run

import torch  # noqa: E402
from route_cases import CASES, STDLIB_HIDDEN, runnable_stdlib_plan, stdlib_policies, with_router  # noqa: E402
from route_inputs import extreme_logits, mixed_state, offset_logits, random_logits, tie_logits  # noqa: E402

import tokenrouter.runtime.engine.compile_ahead as ca  # noqa: E402
from tokenrouter.runtime.engine.compile_ahead import Ahead  # noqa: E402
from tokenrouter.runtime.route import RouteKernel  # noqa: E402
from tokenrouter.runtime.route.routers import RouterSpec, untrained_router_tensors, write_router  # noqa: E402
from tokenrouter.runtime.sampling import DEFAULT_SAMPLER  # noqa: E402

HIDDEN = STDLIB_HIDDEN


@contextmanager
def every_launch_runs(device):
    """`compile_ahead` as an active block whose launches run as usual."""
    yield Ahead(active=True)


def compare(a, b, ir, label: str) -> None:
    assert torch.equal(a.token.cpu(), b.token.cpu()), (
        f"{label}: tokens {a.token.tolist()} != {b.token.tolist()}"
    )
    assert torch.equal(a.rule.cpu(), b.rule.cpu()), f"{label}: rules {a.rule.tolist()} != {b.rule.tolist()}"
    assert torch.allclose(a.logprob.cpu(), b.logprob.cpu(), rtol=1e-5, atol=1e-4), f"{label}: logprob"
    for name, want in a.features.items():
        got = b.features[name].cpu()
        want = want.cpu()
        if want.dtype.is_floating_point:
            ok = torch.allclose(want, got, rtol=1e-5, atol=2e-5)
        else:
            ok = torch.equal(want, got)
        assert ok, f"{label}: feature {name}: {want.tolist()} != {got.tolist()}"


def router_plan(tmp: str, kind: str, inputs: list[dict], ir: dict) -> dict:
    spec = RouterSpec.from_plan("gate", {"kind": kind, "path": os.path.join(tmp, f"gate_{kind}.safetensors"),
                                         "inputs": inputs})  # fmt: skip
    tensors = untrained_router_tensors(kind, spec.width(HIDDEN), (8,), seed=1)
    tensors = {k: v * 4 for k, v in tensors.items()}
    write_router(spec.path, spec, tensors)
    return tensors, spec,  {"routes": {"slm": ir}, "routers": {"gate": {"kind": kind, "path": spec.path, "inputs": inputs}},
            "models": {}}  # fmt: skip


def main() -> int:
    tmp = sys.argv[1]
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    sampler = sys.argv[3] if len(sys.argv) > 3 else DEFAULT_SAMPLER
    rows, vocab = 6, 150
    checked = 0
    chunks: set[int] = set()
    for name, make in sorted(CASES.items()):
        ir = make()
        plan = {"routes": {"slm": ir}, "routers": {}, "models": {}}
        ref = RouteKernel(plan, "slm", "torch", device, sampler=sampler)
        variants = ((1, torch.float32), (4, torch.bfloat16)) if device == "cpu" else ((4, torch.bfloat16),)
        for split, dtype in variants:  # compiled (cuda): one variant, to keep the compile count down
            tri = RouteKernel(plan, "slm", "triton", device, split=split, block=2048, sampler=sampler)
            for inputs, maker in (
                ("random", random_logits),
                ("ties", tie_logits),
                ("extreme", extreme_logits),
                ("offset", offset_logits),
            ):
                if True:
                    logits = maker(rows, vocab, seed=len(name)).to(dtype).to(device)
                    state = mixed_state(rows, restricted=inputs == "random")
                    state = type(state)(*[getattr(state, f).to(device) for f in
                                          ("seed", "position", "temperature", "top_k", "top_p", "run_length",
                                           "generated")])  # fmt: skip
                    label = f"{name} split={split} {inputs} {dtype}"
                    compare(ref(logits, None, state, with_features=True),
                            tri(logits, None, state, with_features=True), ir, label)  # fmt: skip
                    checked += 1
    # several tiles and sampling chunks per row (vocab 5000 = 2 full chunks + 1 partial): the running max
    # growing across tiles, the best tile changing, the chunk table and the two-stage draw, split merges.
    # 12 rows: extreme_logits' special rows (0-5), then six rows at scales 0.2 to 2 over the whole pattern of
    # mixed_state (greedy, T = 1, T != 1); under the interpreter every row's programs cost the same
    big_rows, big_vocab = 12, 5000
    for name in ("citer_like", "bernoulli_split"):
        ir = CASES[name]()
        plan = {"routes": {"slm": ir}, "routers": {}, "models": {}}
        ref = RouteKernel(plan, "slm", "torch", device, sampler=sampler)
        for split, dtype in ((1, torch.float32), (2, torch.bfloat16), (4, torch.float32)):
            tri = RouteKernel(plan, "slm", "triton", device, split=split, block=2048, sampler=sampler)
            for maker in (random_logits, tie_logits, extreme_logits):
                logits = maker(big_rows, big_vocab, seed=split).to(dtype).to(device)
                logits[6:] *= torch.linspace(0.2, 2.0, big_rows - 6)[:, None].to(dtype).to(device)
                state = mixed_state(big_rows, restricted=False)
                state = type(state)(*[getattr(state, f).to(device) for f in
                                      ("seed", "position", "temperature", "top_k", "top_p", "run_length",
                                       "generated")])  # fmt: skip
                a = ref(logits, None, state, with_features=True)
                compare(a, tri(logits, None, state, with_features=True), ir,
                        f"{name} vocab={big_vocab} split={split} {maker.__name__} {dtype}")  # fmt: skip
                chunks.update((a.token[state.temperature.to(device) > 0] // 2048).tolist())
                checked += 1
    assert chunks == {0, 1, 2}, f"sampled tokens came from chunks {sorted(chunks)} only"
    # routers: hidden + top-k inputs (rules in the fused kernel), embedding(token) (the rules kernel)
    table = torch.randn(vocab, HIDDEN, generator=torch.Generator().manual_seed(5)).to(device)

    def embed(tokens):
        return table[tokens]

    variants = [
        ("linear", [{"kind": "hidden", "model": "slm"}, {"kind": "topk_logprobs", "model": "slm", "k": 4}]),
        ("mlp", [{"kind": "topk_logits", "model": "slm", "k": 3}, {"kind": "embedding", "model": "slm"}]),
    ]
    for kind, inputs in variants:
        ir = with_router()
        tensors, spec, plan = router_plan(tmp, kind, inputs, ir)
        logits = random_logits(rows, vocab, seed=9).to(device)
        hidden = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(2)).to(device)
        state = mixed_state(rows)
        state = type(state)(*[getattr(state, f).to(device) for f in
                              ("seed", "position", "temperature", "top_k", "top_p", "run_length", "generated")])  # fmt: skip
        # centre the untrained router's outputs on this batch, so that every rule fires somewhere
        gate = RouteKernel(plan, "slm", "torch", device, embed=embed, hidden_size=HIDDEN)(
            logits, hidden, state, with_features=True
        ).features["gate"]
        tensors["bias" if kind == "linear" else "layers.1.bias"] -= float(gate.median()) + 0.1
        write_router(spec.path, spec, tensors)
        ref = RouteKernel(plan, "slm", "torch", device, embed=embed, hidden_size=HIDDEN, sampler=sampler)
        for split in (1, 2):
            tri = RouteKernel(plan, "slm", "triton", device, embed=embed, hidden_size=HIDDEN, split=split, block=2048,
                              sampler=sampler)  # fmt: skip
            a = ref(logits, hidden, state, with_features=True)
            b = tri(logits, hidden, state, with_features=True)
            compare(a, b, ir, f"router {kind} split={split}")
            # warm's build-only pass (`_build_launches`: the fused kernel, or the rules kernel after
            # embedding(token)), with each of its launches run as launched: the interpreter builds nothing; and
            # the same pass as the engine's start-up runs it (`build_pass`, in the engine's block)
            if split == 1:
                ca.compile_ahead, real = every_launch_runs, ca.compile_ahead  # the block `build_ahead` opens
                try:
                    assert tri.warm(rows, vocab, logits.dtype, HIDDEN) >= 3
                finally:
                    ca.compile_ahead = real
                tri.build_pass(rows, vocab, logits.dtype, HIDDEN)
                compare(a, tri(logits, hidden, state, with_features=True), ir, f"router {kind} after warm")
            assert len(set(a.rule.tolist())) > 1, (
                f"router {kind}: every row took rule {a.rule.tolist()}: {a.features}"
            )
            checked += 1
    # every stdlib policy, compiled, every model (interpreter only: compiled, the hand IRs above cover the ops)
    for path in stdlib_policies() if device == "cpu" else []:
        plan = runnable_stdlib_plan(path, tmp)
        for model in plan["routes"]:
            kw = dict(embed=embed, hidden_size=STDLIB_HIDDEN, sampler=sampler)
            ref = RouteKernel(plan, model, "torch", device, **kw)
            tri = RouteKernel(plan, model, "triton", device, split=2, block=2048, **kw)
            logits = random_logits(rows, vocab, seed=11).to(device)
            hidden = torch.randn(rows, STDLIB_HIDDEN, generator=torch.Generator().manual_seed(4)).to(device)
            a, b = (
                ref(logits, hidden, state, with_features=True),
                tri(logits, hidden, state, with_features=True),
            )
            compare(a, b, plan["routes"][model], f"{path.stem}:{model}")
            checked += 1
    print(f"OK {checked} comparisons (sampler {sampler})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
