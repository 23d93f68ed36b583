"""Route-kernel code generation: a plan's route IR (docs/ir.md) → Python source, by jinja2 templates.

One macro per IR operation per backend (`templates/torch_ops.j2`, `templates/triton_ops.j2`); the kernel
bodies are `templates/torch_route.py.j2` (the reference, CPU and GPU) and `templates/triton_route.py.j2`
(one fused Triton kernel per model). Rendering only ever reads a checked `RouteSpec`, so a plan can make
the renderers emit nothing outside the closed set of operations. Loading and running the rendered source
is the runtime's job (`tokenrouter.runtime.route`).
"""

from tokenrouter.compiler.kernels.render import BACKENDS, render_route_kernel
from tokenrouter.compiler.kernels.route_ir import RouteIRError, RouteSpec, check_route_ir

__all__ = ["BACKENDS", "RouteIRError", "RouteSpec", "check_route_ir", "render_route_kernel"]
