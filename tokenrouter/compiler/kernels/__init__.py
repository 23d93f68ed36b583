"""Route-kernel code generation: a plan's route IR (docs/ir.md) → Python source, by jinja2 templates.

One macro per IR operation per backend (`templates/torch_ops.j2`, `templates/triton_ops.j2`); the kernel
bodies are `templates/torch_route.py.j2` (the reference, CPU and GPU) and `templates/triton_route.py.j2`
(one fused Triton kernel per model). Rendering only ever reads a checked `RouteSpec`, so a plan can make
the renderers emit nothing outside the closed set of operations. Loading and running the rendered source
is the runtime's job (`tokenrouter.runtime.route`).

The two renderers compute the same functions (docs/ir.md), not the same bits: the torch renderer samples
through `tokenrouter.runtime.sampling` (x / T, libm logs); the Triton kernel multiplies by 1/T, uses the
GPU's ex2/lg2 approximations where they are accurate enough (the statistics, the chunk masses of the
two-stage draw, the outer log of the Gumbel noise) and an accurate log for -log(u), and sums in another
order. Tokens and fired rules agree except where two candidates' scores, a draw and a chunk boundary of
the cumulative mass, or a value and a rule's threshold, are within float32 rounding of each other; the
statistics agree to about 1e-6 relative. The RNG itself (the uint32 hash) is bit-identical.
"""

from tokenrouter.compiler.kernels.render import BACKENDS, DEFAULT_SAMPLER, SAMPLERS, render_route_kernel
from tokenrouter.compiler.kernels.route_ir import RouteIRError, RouteSpec, check_route_ir

__all__ = [
    "BACKENDS",
    "DEFAULT_SAMPLER",
    "SAMPLERS",
    "RouteIRError",
    "RouteSpec",
    "check_route_ir",
    "render_route_kernel",
]
