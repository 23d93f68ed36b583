"""Render a checked route IR into torch or Triton source with the jinja2 templates beside this file."""

from __future__ import annotations

import functools

import jinja2

from tokenrouter.compiler.kernels.route_ir import RouteSpec, check_route_ir, operand_type

BACKENDS = ("torch", "triton")
_STAT_SLOTS = ("logprob", "confidence", "margin", "entropy", "norm_entropy")


def _float_literal(value: float) -> str:
    text = repr(float(value))
    if text in ("inf", "-inf", "nan"):  # check_route_ir rejects these; never render a name
        raise ValueError(f"non-finite constant {value!r}")
    return text


def _pystr(value: str) -> str:
    return repr(str(value))


def _pytuple(values) -> str:
    items = [repr(str(v)) for v in values]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tokenrouter.compiler.kernels", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["float_literal"] = _float_literal
    env.filters["pystr"] = _pystr
    env.filters["pytuple"] = _pytuple
    return env


def float_slots(spec: RouteSpec) -> tuple[str, ...]:
    """The float features the Triton kernel stores per row (in this order) when asked to write features."""
    slots = [name for name in _STAT_SLOTS if name in spec.features]
    if spec.uses_uniform:
        slots.append("uniform")
    return tuple(slots)


def _operands(spec: RouteSpec, backend: str) -> list[list[str]]:
    cast = _environment().get_template(f"{backend}_ops.j2").module.cast
    out: list[list[str]] = []
    for node in spec.nodes:
        want = operand_type(spec, node)
        if node.op in ("and", "or", "not"):
            want = "bool"
        out.append([f"({cast(f'v{a}', spec.nodes[a].type, want)})" for a in node.args])
    return out


# tokenrouter.runtime.sampling.SAMPLERS and DEFAULT_SAMPLER, written out (the compiler never imports runtime;
# tests/kernels/test_route_sampling.py checks that they agree)
SAMPLERS = ("cdf", "strided")
DEFAULT_SAMPLER = "strided"
DEBUG_TAILS = ("full", "chunk", "none")


def _check_options(backend: str, sampler: str, debug_tail: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown route-kernel backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; expected one of {', '.join(SAMPLERS)}")
    if debug_tail not in DEBUG_TAILS or (debug_tail != "full" and backend != "triton"):
        raise ValueError(
            f"debug_tail {debug_tail!r}: one of {', '.join(DEBUG_TAILS)} (not full: triton only)"
        )


def render_route_kernel(
    route_ir: dict | RouteSpec,
    backend: str,
    model: str | None = None,
    *,
    sampler: str = DEFAULT_SAMPLER,
    debug_tail: str = "full",
) -> str:
    """Python source of the route kernel for one model's route IR. Raises RouteIRError for a bad IR and
    ValueError for an unknown backend or option. `sampler`: the two-stage draw of temperature sampling
    (tokenrouter.runtime.sampling, docs/ir.md "Randomness"), DEFAULT_SAMPLER unless told otherwise.
    `debug_tail` is for benchmarks only, never for serving: "chunk" (Triton) stops the sampled rows' draw
    after the chunk choice, "none" skips the draw (their tokens are then wrong), to time the sampler's
    serial tail against the kernel's main pass."""
    _check_options(backend, sampler, debug_tail)
    spec = route_ir if isinstance(route_ir, RouteSpec) else check_route_ir(route_ir, model)
    template = _environment().get_template(f"{backend}_route.py.j2")
    return template.render(
        spec=spec,
        operands=_operands(spec, backend),
        router_index={name: i for i, name in enumerate(spec.routers)},
        float_slots=float_slots(spec),
        sampler=sampler,
        debug_tail=debug_tail,
    )
