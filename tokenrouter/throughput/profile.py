"""`tokenrouter profile`: run a plan's models on a sample workload and record L_i(b) and p_ij.

- **Step latency** L_i(b): for each model and each batch size b, b requests are prefilled with a prompt of
  `prompt_len` tokens, then `repeats` decode steps of all b rows are timed (after `warmup` untimed ones;
  CUDA is synchronized around each step); the median is recorded. This is the engine's forward step only
  (the route kernel and sampling, run by the subserver after it, are not included).
- **Routing** p_ij: `prompts` requests run through the plan with the in-process executor (the same
  schedulers, kernels and delayed batching as `serve`); every step's decision is counted from its output
  (`TokenOut.hop_to`: a hop to j, or none = the request stayed; a request's final step, which ends it, is
  not a decision and is not counted). `p_ij = count_ij / Σ_j count_ij`.

The runtime is imported only inside these functions (the rest of the throughput model does not depend on it,
and the runtime never imports the throughput model).
"""

from __future__ import annotations

import datetime as _dt
import statistics
import time
from dataclasses import dataclass, field

from tokenrouter.throughput.inputs import StepLatency
from tokenrouter.throughput.profile_format import Profile


class ProfileRunError(ValueError):
    """The profiling run cannot start or failed (the message is for users)."""


@dataclass(slots=True)
class ProfileConfig:
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    prompts: int = 8
    prompt_len: int = 16
    max_tokens: int = 32
    repeats: int = 5
    warmup: int = 2
    seed: int = 0
    temperature: float = 0.0
    device: str | None = None
    prompt_texts: list[str] = field(default_factory=list)  # tokenized by the entry model; else random ids

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(not isinstance(b, int) or b < 1 for b in self.batch_sizes):
            raise ValueError(f"batch sizes must be ints >= 1, got {self.batch_sizes!r}")
        for name in ("prompts", "prompt_len", "max_tokens", "repeats"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {self.warmup!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if not (self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def measure_step_latency(engine, device: str, cfg: ProfileConfig, vocab: int, tag: str) -> StepLatency:
    """Median decode-step time of `engine` at each batch size in `cfg.batch_sizes` (ms)."""
    import numpy as np

    from tokenrouter.runtime.engine.base import StepInput

    rng = np.random.default_rng(cfg.seed)
    points = []
    for b in cfg.batch_sizes:
        rids = [f"profile-{tag}-{b}-{k}" for k in range(b)]
        try:
            engine.forward([StepInput(r, rng.integers(0, vocab, cfg.prompt_len).tolist()) for r in rids])
            times = []
            for step in range(cfg.warmup + cfg.repeats):
                batch = [StepInput(r, [int(rng.integers(0, vocab))]) for r in rids]
                _sync(device)
                t0 = time.perf_counter()
                engine.forward(batch)
                _sync(device)
                if step >= cfg.warmup:
                    times.append((time.perf_counter() - t0) * 1000.0)
        finally:
            for r in rids:
                engine.release(r)
        points.append((b, statistics.median(times)))
    return StepLatency(tuple(points))


def _counting_executor(plan: dict, device: str | None):
    from tokenrouter.runtime.offline import OfflineExecutor
    from tokenrouter.runtime.subserver.loading import load_model_runtime, pick_device

    class CountingExecutor(OfflineExecutor):
        """The offline executor, counting each step's decision (stay, or hop to j) per model."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.decisions: dict[str, dict[str, int]] = {name: {} for name in plan["models"]}

        def _on_outputs(self, out) -> None:
            done = {f.rid for f in out.finished}
            for t in out.tokens:
                if t.hop_to is None and t.rid in done:
                    continue  # the request's last step: it ends, no routing decision was taken
                row = self.decisions[t.model]
                dest = t.hop_to or t.model
                row[dest] = row.get(dest, 0) + 1
            super()._on_outputs(out)

    engines, kernels, devices = {}, {}, {}
    for name, spec in plan["models"].items():
        devices[name] = pick_device(spec, device)
        engines[name], kernels[name] = load_model_runtime(plan, name, devices[name])
    return CountingExecutor(plan, engines, kernels), devices


def run_profile(plan: dict, cfg: ProfileConfig) -> Profile:
    """Measure L_i(b) for every model and p_ij on a sample workload (see the module docstring)."""
    from tokenrouter.progress import Progress
    from tokenrouter.runtime import threads
    from tokenrouter.runtime.engine.base import EngineError

    threads.set_torch_threads(len(plan["models"]))  # measured with the threads `serve` gives each model
    try:
        ex, devices = _counting_executor(plan, cfg.device)
    except (EngineError, ValueError, OSError) as e:
        raise ProfileRunError(f"cannot load the plan's models: {e}") from None
    progress = Progress("profile", len(ex.schedulers), "models timed")
    step = _time_models(ex, devices, cfg, progress)
    vocab = min(s.engine.info.vocab_size for s in ex.schedulers.values())
    prompts = _sample_prompts(plan, cfg, vocab)
    progress.update(len(ex.schedulers), f"{len(prompts)} sample requests")
    t0 = time.perf_counter()
    results = _sample_run(ex, prompts, cfg)
    progress.finish(len(ex.schedulers))
    wall = time.perf_counter() - t0
    errors = [r.error for r in results if r.error]
    if errors:
        raise ProfileRunError(f"{len(errors)} of {len(results)} sample requests failed: {errors[0]}")
    return Profile(
        policy=plan["policy"]["name"],
        source_sha256=plan.get("source", {}).get("sha256"),
        step_ms=step,
        routing=_shares(ex.decisions),
        counts={k: dict(v) for k, v in ex.decisions.items()},
        device=", ".join(f"{m}: {d}" for m, d in devices.items()),
        created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        workload=_workload(cfg, prompts, results, wall),
    )


def _shares(decisions: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    """Each model's routing: its decisions' counts as shares (models that decided nothing left out)."""
    routing = {}
    for name, row in decisions.items():
        total = sum(row.values())
        if total:
            routing[name] = {dest: n / total for dest, n in row.items()}
    return routing


def _time_models(ex, devices: dict[str, str], cfg: ProfileConfig, progress) -> dict[str, StepLatency]:
    """Each model's step latency at the batch sizes, timed with its device current."""
    from tokenrouter.runtime.engine.base import EngineError
    from tokenrouter.runtime.engine.embedded import device_scope

    step: dict[str, StepLatency] = {}
    for k, (name, sched) in enumerate(ex.schedulers.items()):
        progress.update(k, f"timing {name}")
        vocab = sched.engine.info.vocab_size
        try:  # with the model's GPU current: Triton and CUDA graphs run on the current device
            with device_scope(devices[name]):
                step[name] = measure_step_latency(sched.engine, devices[name], cfg, vocab, name)
        except EngineError as e:
            raise ProfileRunError(f"model {name}: cannot run a batch of the requested size: {e}") from None
    return step


def _sample_prompts(plan: dict, cfg: ProfileConfig, vocab: int) -> list[list[int]]:
    """The sample requests' prompts: the texts tokenized by the entry model (ids within every model's
    vocabulary), else random ids."""
    import numpy as np

    from tokenrouter.runtime.engine.base import EngineError

    if not cfg.prompt_texts:
        rng = np.random.default_rng(cfg.seed + 1)
        return [rng.integers(0, vocab, cfg.prompt_len).tolist() for _ in range(cfg.prompts)]
    from tokenrouter.runtime.engine.generate import load_tokenizer

    try:
        tok = load_tokenizer(plan["models"][plan["entry"]]["path"])
    except EngineError as e:
        raise ProfileRunError(f"text prompts need the entry model's tokenizer: {e}") from None
    prompts = [tok.encode(t).ids for t in cfg.prompt_texts][: cfg.prompts]
    prompts = [[i for i in p if i < vocab] for p in prompts]
    if not all(prompts):
        raise ProfileRunError("a prompt is empty after tokenization")
    return prompts


def _sample_run(ex, prompts: list[list[int]], cfg: ProfileConfig):
    """The sample requests run through the plan, one seed per request: uniform() is a function of (seed,
    position), so shared seeds would correlate draws."""
    from tokenrouter.runtime import messages as msgs

    specs = [
        msgs.SamplingSpec(
            temperature=cfg.temperature, seed=cfg.seed * 100_003 + k + 1, max_tokens=cfg.max_tokens
        )
        for k in range(len(prompts))
    ]
    return ex.generate(prompts, specs)


def _workload(cfg: ProfileConfig, prompts: list[list[int]], results, wall: float) -> dict:
    return {
        "prompts": len(prompts),
        "prompt_source": "texts" if cfg.prompt_texts else f"random ids, {cfg.prompt_len} tokens",
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "seed": cfg.seed,
        "generated_tokens": sum(len(r.token_ids) for r in results),
        "wall_s": round(wall, 3),
        "batch_sizes": list(cfg.batch_sizes),
        "repeats": cfg.repeats,
    }
