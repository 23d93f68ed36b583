"""The route kernel's launch variants (prefetch distance, Triton pipeline stages) under Triton's interpreter:
bit for bit the plain loop's results and the torch renderer's within tolerance (route_variants_check.py, in
a fresh process); compiled for real on a GPU where there is one (marked gpu)."""

from __future__ import annotations

import pytest
import torch
from test_route_triton import _script

from tokenrouter.runtime.route.triton_backend import LaunchOptions
from tokenrouter.runtime.sampling import DEFAULT_SAMPLER, SAMPLERS

# every variant with the default sampler, the widest pipeline with the other one too. Under the interpreter
# only the prefetch distance changes what runs: prefetch 0 is the plain loop itself (every case runs it as the
# reference), and the interpreter ignores Triton's pipeline stages, so (0, 0) and (0, 3) are compiled only.
# Prefetch 1 and 2 with the default sampler run in one process, against one run of the plain loop
DEFAULT = DEFAULT_SAMPLER
(OTHER,) = (s for s in SAMPLERS if s != DEFAULT_SAMPLER)


@pytest.mark.parametrize("prefetch,stages,sampler", [("1,2", 0, DEFAULT), ("2", 0, OTHER)])
def test_variant_matches_plain_loop_bitwise(prefetch, stages, sampler):
    """Each prefetch distance listed gives the plain loop's results bit for bit and the torch renderer's
    within tolerance, on every case, split, tile size and input of route_variants_check.py."""
    out = _script(["route_variants_check.py", prefetch, str(stages), sampler], interpret=True)
    assert "OK" in out and f"(prefetch {prefetch}, stages {stages}," in out and f"sampler {sampler}" in out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "prefetch,stages,sampler", [(0, 0, DEFAULT), (2, 0, DEFAULT), (0, 3, DEFAULT), (2, 0, OTHER)]
)
def test_compiled_variant_matches_plain_loop_bitwise(prefetch, stages, sampler):
    out = _script(["route_variants_check.py", str(prefetch), str(stages), "cuda", sampler], interpret=False)
    assert "OK" in out and f"sampler {sampler}" in out


@pytest.mark.parametrize(
    "bad", [dict(prefetch=3), dict(stages=-1), dict(split=3), dict(block=3000), dict(warps=3)]
)
def test_launch_options_reject_bad_values(bad):
    with pytest.raises(ValueError):
        LaunchOptions(**bad)
