"""Loading one model of a plan: its engine (placement, dtype, memory share) and its route kernel."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)
MEM_HEADROOM = 0.9  # of the model's share of GPU memory, for weights + KV (the rest: activations, graphs)


def pick_device(spec: dict, override: str | None = None, require_cuda: bool = False) -> str:
    """`override`, else `cuda:<first of the model's gpus>` when CUDA is available (every one of them visible), else
    `cpu`; with `require_cuda` (`serve --device cuda`), a ValueError where torch cannot use CUDA. A model on several
    GPUs runs tensor-parallel with rank 0 on this device (`load_model_engine`)."""
    import torch

    if override:
        return override
    if require_cuda and not torch.cuda.is_available():
        raise ValueError(
            f"--device cuda: torch {torch.__version__} here cannot use CUDA (torch.cuda.is_available() is False; a "
            "CPU-only torch, or a driver too old for it); use --device cpu"
        )
    if torch.cuda.is_available():
        gpus = spec.get("gpus") or [0]
        if max(gpus) >= torch.cuda.device_count():
            raise ValueError(
                f"model {spec.get('path')} is placed on GPU {max(gpus)}, but {torch.cuda.device_count()} GPU(s) "
                "are visible (change its `gpu:` option, or pass a device)"
            )
        return f"cuda:{gpus[0]}"
    return "cpu"


def gpu_count_problem(
    plan: dict, models: list[str], device: str | None, visible: int | None = None
) -> str | None:
    """What is wrong with the GPUs that `models` of the plan are placed on, on a machine with `visible` GPUs (None:
    as many as the driver reports, `cuda_info`; without CUDA, or with `device` "cpu", the models run on the CPU and
    no count applies)."""
    if device is not None and str(device).startswith("cpu"):
        return None
    if visible is None:
        from tokenrouter.runtime.cuda_info import device_count

        visible = device_count()
        if not visible:
            return None
    for name in models:
        gpus = plan["models"][name].get("gpus") or [0]
        if max(gpus) >= visible:
            asks = f"{len(gpus)} GPUs ({', '.join(map(str, gpus))})" if len(gpus) > 1 else f"GPU {gpus[0]}"
            return (
                f"model {name!r} asks for {asks}, but this machine has {visible} GPU(s) (0..{visible - 1}); "
                "change its `gpus:`, or serve with --device cpu"
            )
    return None


def engine_kwargs(spec: dict, device: str) -> dict:
    """load_engine settings from a plan's model entry. On CPU the engine computes in float32 (the plan's
    dtype applies on CUDA). `mem` (a fraction of the GPU's memory) becomes a KV budget in bytes: that share
    of the device's total memory, times MEM_HEADROOM, minus the weights."""
    kw: dict = {"load": spec.get("load", "auto")}
    if spec.get("max_len") is not None:
        kw["max_len"] = int(spec["max_len"])
    cuda = str(device).startswith("cuda")
    if cuda:
        kw["dtype"] = spec.get("dtype") or "bfloat16"
    elif spec.get("dtype") not in (None, "float32"):
        logger.info("model %s: computing in float32 on CPU (plan dtype %s)", spec.get("path"), spec["dtype"])
    if cuda and spec.get("mem") is not None:
        import torch

        from tokenrouter.runtime.engine.config import load_model_config

        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
        width = 4 if kw["dtype"] == "float32" else 2
        # a tensor-parallel model's GPUs each hold their share of the weights
        weights = load_model_config(spec["path"]).num_params() * width // len(spec.get("gpus") or [0])
        kw["mem_bytes"] = max(int(spec["mem"] * total * MEM_HEADROOM) - weights, 64 << 20)
    return kw


def _load_sglang(spec: dict, model: str, device: str, progress, overrides: dict):
    """`load_model_engine` for a model served by SGLang (optional: imported only here, its absence is an
    EngineError)."""
    from tokenrouter.runtime.engine.sglang_engine import load_sglang_engine

    logger.warning("model %s: the SGLang engine has no prefix cache; --no-prefix-cache changes nothing for it",
                   model)  # fmt: skip
    kw = {**engine_kwargs(spec, device), **overrides}
    start = time.perf_counter()
    engine = load_sglang_engine(spec["path"], model=model, device=device, **kw)
    if progress is not None:
        progress("weights", f"SGLang engine loaded in {time.perf_counter() - start:.1f} s")
    return engine


def load_model_engine(
    plan: dict, model: str, device: str, progress=None, *, prefix_cache: bool = True, **overrides
):
    """The engine of one model of a plan on `device`; `overrides` go to load_engine. `prefix_cache`: the embedded
    engine shares KV across requests (`PrefixCachingEngine`, runtime/prefix_cache.py); the SGLang engine runs
    without it either way (docs/sglang.md). `progress(phase, detail)`, where given, hears of each phase of the
    start-up as it is done (`messages.Progress`)."""
    from tokenrouter.hub import model_folder

    spec = plan["models"][model]
    spec = {**spec, "path": model_folder(spec["path"], fetch=False)}  # a hub id: its cached snapshot
    kind = spec.get("engine", "embedded")
    if kind not in ("embedded", "sglang"):
        raise ValueError(f"model {model!r}: unknown engine {kind!r} (expected 'embedded' or 'sglang')")
    gpus = spec.get("gpus") or [0]
    if len(gpus) > 1 and kind == "sglang":
        logger.warning("model %s: the SGLang engine runs on %s only (tensor parallelism: the embedded engine)",
                       model, device)  # fmt: skip
    if kind == "sglang":
        return _load_sglang(spec, model, device, progress, overrides)
    return _load_embedded(plan, spec, device, progress, prefix_cache, overrides)


def _load_embedded(plan: dict, spec: dict, device: str, progress, prefix_cache: bool, overrides: dict):
    """`load_model_engine` for a model served by the embedded engine: with the prefix cache unless told
    otherwise, tensor parallel over the model's GPUs where it has several."""
    from tokenrouter.runtime.engine.embedded import load_engine

    gpus = spec.get("gpus") or [0]
    if prefix_cache and overrides.get("engine_class") is None:
        from tokenrouter.runtime.prefix_cache import PrefixCachingEngine

        overrides["engine_class"] = PrefixCachingEngine
    # graphs wide enough for a step of every request the plan serves at once
    rows = (
        {"graph_rows": int(plan["serve"]["concurrency"])} if plan.get("serve", {}).get("concurrency") else {}
    )
    kw = {**rows, **engine_kwargs(spec, device), **overrides}
    if len(gpus) > 1:  # tensor parallel: this process is rank 0 of one rank per GPU (subserver/tp_worker.py)
        from tokenrouter.runtime.subserver.tp_worker import load_tp_engine, tp_devices

        return load_tp_engine(spec["path"], tp_devices(gpus, device), progress=progress, **kw)
    return load_engine(spec["path"], device=device, progress=progress, **kw)


def warmed(model: str, what: str, unit: str, warm, progress=None) -> None:
    """Run `warm()` (it returns how many steps or launches it made) and, where it made any, log them with the
    Triton kernels loaded meanwhile (a load is a build where the machine has none in Triton's disk cache, about
    1 s each, else a read) and tell `progress` (phase "kernels")."""
    from tokenrouter.runtime.engine import kernel_loads

    kernel_loads.install()
    before, start = kernel_loads.LOADS.snapshot(), time.perf_counter()
    if n := warm():
        loads, _, _ = kernel_loads.LOADS.since(before)
        detail = f"{what}: {n} {unit}, {loads} Triton kernel load(s), {time.perf_counter() - start:.1f} s"
        logger.info("model %s: %s", model, detail)
        if progress is not None:
            progress("kernels", detail)


def load_model_runtime(
    plan: dict, model: str, device: str, *, warm_rows: int | None = None, progress=None, **overrides
):
    """(engine, route kernel) of one model of a plan on `device`; `overrides` go to load_engine. The engine's
    steps that no CUDA graph holds are run once each (`EmbeddedEngine.warm_eager`; nothing without graphs), and
    the route kernel is warmed (`RouteKernel.warm`) for steps of up to `warm_rows` rows (default: the engine's
    `max_batch`; 0: not warmed), so that neither builds a Triton kernel in a served step. On one GPU the route
    kernel's Triton kernels are built in the engine's start-up block (`also_build`), beside the engine's own.
    `progress(phase, detail)` hears of each phase as it is done."""
    from tokenrouter.runtime.route import RouteKernel
    from tokenrouter.runtime.route.routers import check_router_digests

    check_router_digests(plan, model)
    # the fused Triton kernel on CUDA; the torch renderer on CPU (even when TRITON_INTERPRET is set)
    backend = "auto" if str(device).startswith("cuda") else "torch"
    built: list = []  # the route kernel, where the engine's start-up built its kernels (`build_route`)

    def make_kernel(engine):
        return RouteKernel(plan, model, backend, device, engine.embed)

    def warm_rows_of(engine) -> int:
        return engine.max_batch if warm_rows is None else warm_rows

    def build_route(engine) -> None:  # inside the engine's start-up block: the route's builds join its own
        kernel = make_kernel(engine)
        info = engine.info
        kernel.build_pass(warm_rows_of(engine), info.vocab_size, info.logits_dtype, info.hidden_size)
        built.append(kernel)

    spec = plan["models"][model]
    # the embedded engine on one GPU (a tensor-parallel rank's start-up runs no route work: `eager_built_at_start`)
    if spec.get("engine", "embedded") == "embedded" and len(spec.get("gpus") or [0]) == 1:
        overrides = {"also_build": build_route, **overrides}
    engine = load_model_engine(plan, model, device, progress, **overrides)
    warm_eager = getattr(engine, "warm_eager", None)  # the embedded engine with CUDA graphs
    if warm_eager is not None:
        warmed(model, "eager steps warmed (kinds no CUDA graph holds)", "steps", warm_eager, progress)
    kernel = built[0] if built else make_kernel(engine)
    rows, info = warm_rows_of(engine), engine.info
    warmed(model, f"route kernel warmed for steps of up to {rows} rows", "launches",
           lambda: kernel.warm(rows, info.vocab_size, info.logits_dtype, info.hidden_size, build_ahead=not built),
           progress)  # fmt: skip
    return engine, kernel
