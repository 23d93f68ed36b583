"""Where one subserver step's time goes, on the real engine (issue 7: on the H200 the 0.6B subserver's step
took 2.5 ms in lockstep and 3.2 ms next to the 8B, against a 0.83-1.25 ms CUDA-graph forward).

Builds the model folder (`make-model --shape`, config only; `dummy` weights on the device), a one-model
plan (`policy solo: model a = FOLDER; entry a`: every row stays, so each step is a decode of `--rows`
requests), the subserver's `Scheduler` with its route kernel (`auto`: Triton on CUDA), then times
`--steps` steps, each split into parts with a device sync between them:

  engine   `Scheduler._forward` (HeldRequestsEngine.forward: validation, KV allocation, ForwardBatch build,
           CUDA-graph replay or eager forward)
  route    `Scheduler._route` (route state, route kernel, results to the host)
  rest     the rest of `Scheduler.step` (commit tokens, outgoing messages)

and, without the syncs, the plain `Scheduler.step()` as the subserver runs it. With `--torch-profile` it
also records 20 steps with torch.profiler and prints the CPU-side operators by self time (where host time
goes: cudaMemcpyAsync, cudaLaunchKernel, cudaStreamSynchronize, Python-side torch ops). With `--host-split`
the plain steps also time (wall clock, no syncs, inclusive of what each calls) the host functions of the
step path: the time a function takes includes any wait on the device inside it (a device-to-host copy
waits for the step's kernels; a graph launch may block), so the table shows where the host spends the step.
It also splits each step in three phases: *before the launch* (step start to the graph launch, or to the
eager model call without graphs), *launch to results* (to the end of `_tokens_and_rules`: the host work
that overlaps the GPU, then the wait) and *after the results* (committing tokens, messages): on a GPU the
first and the last do not overlap the device. `--stub-graphs` (CPU only) installs a stand-in graph runner
whose launch returns fixed outputs: the step then takes the graph path's host work (`ForwardBatch.build`
without device tensors, the runner's input staging `load_batch`) with no model forward, so the host path
of a GPU step can be timed on CPU (CUDA's own host costs, copies and launches, are not in it).

    python bench/step_profile.py --shape qwen3-0.6b --rows 1,4,8 [--steps 300] [--torch-profile] [--out DIR]
    python bench/step_profile.py --shape tiny --device cpu --rows 1,4 --steps 20      # CPU smoke run
    OMP_NUM_THREADS=1 python bench/step_profile.py --shape tiny --device cpu --rows 1,4 --steps 1000 \
        --host-split --stub-graphs                                                      # GPU host path, on CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tokenrouter.compiler.driver import compile_file  # noqa: E402
from tokenrouter.runtime import messages as m  # noqa: E402
from tokenrouter.runtime.engine.embedded import load_engine  # noqa: E402
from tokenrouter.runtime.engine.make_model import make_model, shape_for  # noqa: E402
from tokenrouter.runtime.route import RouteKernel  # noqa: E402
from tokenrouter.runtime.subserver.batching import BatchingConfig  # noqa: E402
from tokenrouter.runtime.subserver.scheduler import Scheduler  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build(shape: str, device: str, work: Path, max_batch: int) -> Scheduler:
    folder = work / shape
    if not (folder / "config.json").exists():
        make_model(folder, shape_for(shape), seed=0)
    src = work / "solo.tr"
    src.write_text(f'policy solo\nmodel a = "{folder}" {{ batch: 1 }}\nentry a\n')
    res = compile_file(src)
    if not res.ok:
        raise SystemExit("\n".join(str(d) for d in res.diagnostics))
    plan = res.plan
    load = "dummy" if not any(folder.glob("*.safetensors")) else "auto"
    engine = load_engine(folder, device=device, load=load, max_batch=max_batch, max_len=4096)
    kernel = RouteKernel(plan, "a", "auto", device)
    return Scheduler("a", plan, engine, kernel, batching=BatchingConfig({"a": 1}, 0.0), max_batch=max_batch)


def timed_parts(s: Scheduler, device: str) -> dict[str, float]:
    """One step with a sync after each part (ms per part)."""
    batch = s.get_next_batch_to_run()
    t0 = time.perf_counter()
    step = s._forward(batch)
    sync(device)
    t1 = time.perf_counter()
    result = s._route(batch, step)
    sync(device)
    t2 = time.perf_counter()
    s.process_batch_result(batch, result)
    sync(device)
    t3 = time.perf_counter()
    return {"engine": (t1 - t0) * 1e3, "route": (t2 - t1) * 1e3, "rest": (t3 - t2) * 1e3}


def host_split_targets() -> list[tuple[object, str]]:
    """(owner, attribute) of the host functions `--host-split` times."""
    from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphRunner
    from tokenrouter.runtime.engine.embedded import EmbeddedEngine
    from tokenrouter.runtime.engine.forward_batch import ForwardBatch
    from tokenrouter.runtime.engine.held import HeldRequestsEngine
    from tokenrouter.runtime.route import RouteBatchState
    from tokenrouter.runtime.route.kernel import RouteKernel
    from tokenrouter.runtime.route.state import RouteStatePacker

    return [
        (HeldRequestsEngine, "forward"),
        (EmbeddedEngine, "_forward_fitting"),
        (ForwardBatch, "build"),
        (EmbeddedEngine, "_run_model"),
        (CudaGraphRunner, "load_batch"),
        (CudaGraphRunner, "_launch"),
        (Scheduler, "_route_state"),
        (RouteBatchState, "pack"),
        (RouteStatePacker, "pack"),
        (RouteKernel, "__call__"),
        (Scheduler, "process_batch_result"),
        (Scheduler, "_tokens_and_rules"),
    ]


class NoGraph:
    def replay(self) -> None:
        pass


class StubGraphRunner:
    """`--stub-graphs`: a CUDA-graph runner on the CPU whose launch returns fixed random outputs (made once per
    shape); everything before the launch (shape choice, `load_batch`'s host staging) is the real runner's."""

    @staticmethod
    def install(engine) -> None:
        from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner

        class Stub(CudaGraphRunner):
            def capture(self) -> None:
                g = torch.Generator().manual_seed(0)
                v, h = engine.model_config.vocab_size, engine.model_config.hidden_size
                for bs, q in self.config.shapes():
                    self.outputs[(bs, q)] = (torch.randn(bs, v, generator=g), torch.randn(bs, h, generator=g))
                    self.graphs[(bs, q)] = NoGraph()

        backend = engine.attn_backend
        had = getattr(backend, "supports_cuda_graph", None)
        backend.supports_cuda_graph = True  # the stand-in never runs attention in a graph
        try:
            engine.graph_runner = Stub(engine, CudaGraphConfig())
        finally:
            if had is None:
                del backend.supports_cuda_graph
            else:
                backend.supports_cuda_graph = had


class HostSplit:
    """Wraps the functions of `host_split_targets` with wall-clock timers while active; `entered` and `left`
    hold the last time each was entered and left (for the phases of a step)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.entered: dict[str, float] = {}
        self.left: dict[str, float] = {}
        self._saved: list[tuple[object, str, object]] = []

    def __enter__(self) -> HostSplit:
        for owner, attr in host_split_targets():
            raw = owner.__dict__[attr]
            name = f"{owner.__name__}.{attr}"
            kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
            fn = raw.__func__ if kind else raw

            def timed(*a, _fn=fn, _name=name, **k):
                t = self.entered[_name] = time.perf_counter()
                try:
                    return _fn(*a, **k)
                finally:
                    end = self.left[_name] = time.perf_counter()
                    self.total[_name] = self.total.get(_name, 0.0) + end - t
                    self.calls[_name] = self.calls.get(_name, 0) + 1

            setattr(owner, attr, kind(timed) if kind else timed)
            self._saved.append((owner, attr, raw))
        return self

    def __exit__(self, *exc) -> None:
        for owner, attr, raw in reversed(self._saved):
            setattr(owner, attr, raw)
        self._saved.clear()

    def per_step_ms(self, steps: int) -> dict[str, float]:
        return {k: v * 1e3 / steps for k, v in self.total.items()}


PHASES = ("phase: before the launch", "phase: launch to results on the host", "phase: after the results")


def run_rows(
    s: Scheduler,
    device: str,
    rows: int,
    steps: int,
    warmup: int,
    torch_profile: bool,
    host_split: bool = False,
) -> dict:
    spec = m.SamplingSpec(seed=1, max_tokens=steps * 3 + warmup * 3 + 64, ignore_eos=True)
    rids = [f"r{rows}-{i}" for i in range(rows)]
    for rid in rids:
        s.handle(m.NewRequest(rid, list(range(10, 42)), spec, n_active=rows))
    for _ in range(warmup):
        s.step()
    sync(device)
    parts = [timed_parts(s, device) for _ in range(steps)]
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        s.step()
    sync(device)
    plain = (time.perf_counter() - t) * 1e3 / steps
    split = None
    if host_split:
        phase = dict.fromkeys(PHASES, 0.0)
        with HostSplit() as hs:
            t = time.perf_counter()
            for _ in range(steps):
                t0 = time.perf_counter()
                s.step()
                t1 = time.perf_counter()
                launch = hs.entered.get("CudaGraphRunner._launch", -1.0)
                if launch < t0:  # no graph replayed: the eager model call
                    launch = hs.entered.get("EmbeddedEngine._run_model", -1.0)
                if launch < t0:
                    raise SystemExit(f"a step ran no model: {steps} steps are too many for --rows {rows}")
                results = hs.left["Scheduler._tokens_and_rules"]
                phase[PHASES[0]] += launch - t0
                phase[PHASES[1]] += results - launch
                phase[PHASES[2]] += t1 - results
            sync(device)
            split_step = (time.perf_counter() - t) * 1e3 / steps
        split = {"step_ms": split_step, **hs.per_step_ms(steps)}
        split.update({k: v * 1e3 / steps for k, v in phase.items()})
    graph = getattr(s.engine, "graph_runner", None)
    out = {
        "rows": rows,
        "step_ms": plain,
        **{k: statistics.median(p[k] for p in parts) for k in ("engine", "route", "rest")},
        "graphs": bool(graph is not None and graph.replays_by_shape),
    }
    if split is not None:
        out["host_split_ms"] = split
    if torch_profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
        with profile(activities=acts) as prof:
            for _ in range(20):
                s.step()
            sync(device)
        out["torch_profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    for rid in rids:
        s.handle(m.Release(rid))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shape", default="qwen3-0.6b", help="make-model shape (tiny, qwen3-0.6b, qwen3-8b, ...)"
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", default="1,4,8")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--torch-profile", action="store_true")
    ap.add_argument("--host-split", action="store_true", help="time the host functions of the step path")
    ap.add_argument(
        "--stub-graphs", action="store_true", help="CPU: a graph runner whose launch returns fixed outputs"
    )
    ap.add_argument("--out", default=None, help="write step_profile.json (and the profiler tables) here")
    a = ap.parse_args(argv)
    try:
        rows = [int(x) for x in a.rows.split(",") if x.strip()]
    except ValueError:
        print(f"error: bad --rows {a.rows!r}: expected ints like 1,4,8", file=sys.stderr)
        return 2
    if not rows or min(rows) < 1 or a.steps < 1:
        print("error: --rows and --steps must be positive", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        s = build(a.shape, a.device, Path(tmp), max(rows))
        if a.stub_graphs:
            if a.device != "cpu":
                print("error: --stub-graphs is for --device cpu", file=sys.stderr)
                return 2
            StubGraphRunner.install(s.engine)
        print(f"# {a.shape} on {a.device}: built in {time.perf_counter() - t0:.1f} s; route kernel "
              f"{s.kernel.backend}", flush=True)  # fmt: skip
        results = [run_rows(s, a.device, r, a.steps, a.warmup, a.torch_profile, a.host_split) for r in rows]
    print("\n| rows | step ms (as served) | engine ms | route ms | rest ms | parts sum | graphs |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        total = r["engine"] + r["route"] + r["rest"]
        print(f"| {r['rows']} | {r['step_ms']:.3f} | {r['engine']:.3f} | {r['route']:.3f} | {r['rest']:.3f} "
              f"| {total:.3f} | {'yes' if r['graphs'] else 'no'} |")  # fmt: skip
    splits = [r for r in results if "host_split_ms" in r]
    if splits:
        order = ["step_ms", *PHASES] + [f"{o.__name__}.{a}" for o, a in host_split_targets()]
        names = [n for n in order if n in splits[0]["host_split_ms"]]
        print("\n## Host functions, ms per step (wall clock, inclusive, no syncs; the first row is the timed "
              "step itself)\n")  # fmt: skip
        print("| function | " + " | ".join(f"{r['rows']} rows" for r in splits) + " |")
        print("| --- |" + " ---: |" * len(splits))
        for n in names:
            print(f"| {n} | " + " | ".join(f"{r['host_split_ms'].get(n, 0.0):.3f}" for r in splits) + " |")
    for r in results:
        if "torch_profile" in r:
            print(f"\n## torch.profiler, {r['rows']} rows, 20 steps (CPU self time first)\n")
            print(r["torch_profile"])
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "step_profile.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
