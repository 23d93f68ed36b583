"""`RouteKernel.warm` under Triton's interpreter (run as a script with TRITON_INTERPRET=1 set before triton is
imported; test_route_warm.py runs it): it launches one batch per launch variant (on CPU, one configuration for
greedy, without and with forced tokens, and one for sampling, without and with top-k), and a kernel that was
warmed routes a batch exactly as one that was not. Prints "OK" and the launches."""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import triton_interp  # noqa: E402

triton_interp.install()

import torch  # noqa: E402
from route_cases import CASES  # noqa: E402
from route_inputs import mixed_state, random_logits  # noqa: E402

from tokenrouter.runtime.route import RouteKernel  # noqa: E402


def main() -> int:
    rows, vocab = 6, 150
    plan = {"routes": {"slm": CASES["bernoulli_split"]()}, "routers": {}, "models": {}}
    warmed = RouteKernel(plan, "slm", "triton", "cpu")
    cold = RouteKernel(plan, "slm", "triton", "cpu")
    launches = warmed.warm(rows, vocab, torch.float32)
    assert launches == 4, launches
    assert RouteKernel(plan, "slm", "torch", "cpu").warm(rows, vocab, torch.float32) == 0
    logits = random_logits(rows, vocab, seed=3)
    state = mixed_state(rows, restricted=True)
    a, b = warmed(logits, None, state), cold(logits, None, state)
    assert torch.equal(a.token, b.token) and torch.equal(a.rule, b.rule), (a.token, b.token, a.rule, b.rule)
    assert torch.equal(a.logprob, b.logprob)
    print(f"OK warmed in {launches} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
