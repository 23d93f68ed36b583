"""The compiled Triton route kernel against the torch renderer at the full vocabulary (151,936) on a GPU:
bs 1 / 8 / 64 (the launcher's split and tile choices), fp32 and bf16 logits, random, tied and extreme rows,
greedy, temperature (T = 1 and not), top-k and top-p rows. Tokens and fired rules must be equal, except
sampled rows within float rounding of another outcome, counted and printed: with the "strided" sampler (the
default, tokenrouter.runtime.sampling.DEFAULT_SAMPLER) rows whose two best chunk scores, or two best Gumbel
scores within the chunk, are within 1e-4 of each other; with the word `cdf` among the arguments both
renderers use the "cdf" sampler, and the tolerated rows are those whose chunk draw u lies within 1e-5
(relative) of a chunk boundary of the cumulative mass (docs/ir.md: the two renderers sum in different
orders). A script, so that it runs where pytest is not installed: python route_gpu_check.py
[ROWS,... [VOCAB [cpu]]] [cdf|strided] (cpu: under Triton's interpreter, to check this script itself at a
small vocabulary). Exits non-zero on a mismatch."""

from __future__ import annotations

import math
import os
import sys

SAMPLER = next((a for a in sys.argv[1:] if a in ("cdf", "strided")), None)  # None: the default (below)
sys.argv = [a for a in sys.argv if a not in ("cdf", "strided")]
if sys.argv[3:4] == ["cpu"]:
    os.environ["TRITON_INTERPRET"] = "1"
else:
    os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from route_cases import CASES  # noqa: E402
from route_inputs import extreme_logits, mixed_state, offset_logits, random_logits, tie_logits  # noqa: E402

from tokenrouter.runtime.rng import STREAM_CHUNK, STREAM_GROUP, STREAM_SAMPLE, U_MAX, U_MIN, uniform_int  # noqa: E402
from tokenrouter.runtime.route import RouteBatchState, RouteKernel  # noqa: E402
from tokenrouter.runtime.sampling import DEFAULT_SAMPLER, SAMPLE_CHUNK, SAMPLE_GROUP  # noqa: E402

SAMPLER = SAMPLER or DEFAULT_SAMPLER


def near_chunk_boundary(row: torch.Tensor, temperature: float, seed: int, position: int) -> bool:
    z = row.double() / temperature
    w = torch.nn.functional.pad(torch.exp(z - z.max()), (0, -row.numel() % SAMPLE_CHUNK))
    cum = torch.cumsum(w.view(-1, SAMPLE_CHUNK).sum(-1), 0)
    u = uniform_int(seed & (2**64 - 1), position, STREAM_CHUNK, 0)
    return bool(((cum / cum[-1] - u).abs() < 1e-5).any())


def _gumbel(seed: int, position: int, stream: int, index: int) -> float:
    return -math.log(
        -math.log(min(max(uniform_int(seed & (2**64 - 1), position, stream, index), U_MIN), U_MAX))
    )


def near_strided_tie(row: torch.Tensor, temperature: float, seed: int, position: int) -> bool:
    """The "strided" draw in float64: are the two best chunk scores, or the two best Gumbel scores within
    the chosen chunk, within 1e-4 of each other?"""
    z = row.double() / temperature
    vocab, groups = row.numel(), SAMPLE_CHUNK // SAMPLE_GROUP
    e = torch.nn.functional.pad(torch.exp(z - z.max()), (0, -vocab % SAMPLE_CHUNK))
    w = e.view(-1, groups, SAMPLE_GROUP).sum((0, 2))
    score = torch.log(w) + torch.tensor([_gumbel(seed, position, STREAM_GROUP, j) for j in range(groups)],
                                        dtype=torch.float64)  # fmt: skip
    top = score.topk(2).values
    if float(top[0] - top[1]) < 1e-4:
        return True
    j = int(score.argmax())
    ids = [v for v in range(vocab) if (v % SAMPLE_CHUNK) // SAMPLE_GROUP == j]
    inner = torch.tensor([float(z[v]) + _gumbel(seed, position, STREAM_SAMPLE, v) for v in ids])
    top = inner.topk(min(2, len(ids))).values
    return len(ids) > 1 and float(top[0] - top[1]) < 1e-4


def main() -> int:
    dev = torch.device("cpu" if sys.argv[3:4] == ["cpu"] else "cuda")
    vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 151_936
    batches = [int(b) for b in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 8, 64]
    checked = ties = 0
    for name in ("citer_like", "bernoulli_split"):  # every statistic; uniform() and no statistic
        plan = {"routes": {"slm": CASES[name]()}, "routers": {}, "models": {}}
        ref = RouteKernel(plan, "slm", "torch", dev, sampler=SAMPLER)
        tri = RouteKernel(plan, "slm", "triton", dev, split=2 if dev.type == "cpu" else None, sampler=SAMPLER)
        for rows in batches:
            for dtype in (torch.float32, torch.bfloat16):
                for make in (random_logits, tie_logits, extreme_logits, offset_logits):
                    logits = make(max(rows, 6), vocab, seed=rows)[:rows].to(dtype).to(dev)
                    host = mixed_state(rows)
                    state = RouteBatchState(*[getattr(host, f).to(dev) for f in (
                        "seed", "position", "temperature", "top_k", "top_p", "run_length", "generated")])  # fmt: skip
                    a = ref(logits, None, state, with_features=True)
                    b = tri(logits, None, state, with_features=True)
                    label = f"{name} bs={rows} {dtype} {make.__name__}"
                    for i in torch.nonzero((a.token != b.token) | (a.rule != b.rule)).flatten().tolist():
                        t = float(host.temperature[i])
                        near = near_chunk_boundary if SAMPLER == "cdf" else near_strided_tie
                        if t > 0 and near(
                            logits[i].float().cpu(), t, int(host.seed[i]), int(host.position[i])
                        ):
                            ties += 1
                            continue
                        print(f"MISMATCH {label} row {i}: token {int(a.token[i])} vs {int(b.token[i])}, "
                              f"rule {int(a.rule[i])} vs {int(b.rule[i])}")  # fmt: skip
                        return 1
                    torch.testing.assert_close(b.logprob, a.logprob, rtol=1e-5, atol=2e-4, msg=label)
                    for key, want in a.features.items():
                        got = b.features[key]
                        if want.dtype.is_floating_point:
                            torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5, msg=f"{label} {key}")
                        else:
                            assert torch.equal(got, want), (label, key)
                    checked += 1
                print(f"ok {name} bs={rows} {dtype}", flush=True)
    assert math.isfinite(checked)
    what = "at a chunk boundary" if SAMPLER == "cdf" else "with near-tied chunk or Gumbel scores"
    print(f"OK {checked} full-vocabulary comparisons, sampler {SAMPLER} ({ties} sampled rows {what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
