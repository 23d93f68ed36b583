"""The in-process executor: every model's `Scheduler` in one process, messages routed in memory.

Same schedulers, same delayed batching, same hops as `tokenrouter serve`, without sockets or threads; used
by `tokenrouter generate PLAN` and by the tests. It also plays the frontend's part: it publishes the number
of active requests n (with `NewRequest` to the entry model and `ActiveCount` to every model), collects the
`StepOutputs`, and broadcasts `Release` when a request finishes.

Time is virtual: when no subserver is ready but one has a runnable request, the clock jumps to the earliest
`max_delay_ms` deadline instead of sleeping. When none is ready, none has a deadline and no message is in
flight while requests are still active, the run has stalled and `StallError` says where every request is
(with the timeout enabled this cannot happen; the property test disables it to check the threshold rule).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tokenrouter.runtime import messages as m
from tokenrouter.runtime.engine.base import Engine, EngineError
from tokenrouter.runtime.engine.embedded import device_scope
from tokenrouter.runtime.subserver.batching import BatchingConfig
from tokenrouter.runtime.subserver.scheduler import FRONTEND, Scheduler


class StallError(RuntimeError):
    """No subserver can run, nothing is in flight, and requests are still active."""


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(slots=True)
class RequestResult:
    rid: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # which model wrote each token
    hops: list[tuple[str, str]] = field(default_factory=list)  # (from, to) per hand-off, in order
    finish_reason: str | None = None
    error: str | None = None


class OfflineExecutor:
    def __init__(
        self,
        plan: dict,
        engines: dict[str, Engine],
        kernels: dict[str, Callable],
        *,
        batching: BatchingConfig | None = None,
        max_batch: int = 256,
        publish_active: bool = True,
    ) -> None:
        self.plan = plan
        self.publish_active = publish_active  # False: n is never lowered after a finish (a stale count)
        self.clock = VirtualClock()
        self.schedulers = {
            name: Scheduler(
                name,
                plan,
                engines[name],
                kernels[name],
                batching=batching,
                clock=self.clock,
                max_batch=max_batch,
            )
            for name in plan["models"]
        }
        self.entry = plan["entry"]
        self.queue: deque[tuple[str, object]] = deque()
        self.results: dict[str, RequestResult] = {}
        self.active: set[str] = set()
        self.count_seq = 0  # numbers the published counts (`messages.ActiveCount`)
        self.steps: dict[str, int] = {name: 0 for name in plan["models"]}

    # ---- the frontend's part -----------------------------------------------------------------------------

    def submit(self, rid: str, prompt_ids: Sequence[int], sampling: m.SamplingSpec) -> None:
        if rid in self.results:
            raise ValueError(f"request id {rid!r} was already submitted")
        self.results[rid] = RequestResult(rid, list(prompt_ids))
        self.active.add(rid)
        self.count_seq += 1
        new = m.NewRequest(rid, list(prompt_ids), sampling, len(self.active), count_seq=self.count_seq)
        self.queue.append((self.entry, new))
        self._publish_count()

    def abort(self, rid: str) -> None:
        if rid in self.active:
            self.active.discard(rid)
            self.results[rid].finish_reason = "abort"
            for name in self.schedulers:
                self.queue.append((name, m.Abort(rid)))
            self._publish_count()

    def _publish_count(self) -> None:
        self.count_seq += 1  # numbered as the frontend numbers them (`messages.ActiveCount`)
        for name in self.schedulers:
            self.queue.append((name, m.ActiveCount(len(self.active), self.count_seq)))

    def _on_outputs(self, out: m.StepOutputs) -> None:
        for t in out.tokens:
            res = self.results[t.rid]
            if t.rid not in self.active:
                continue
            if t.index != len(res.token_ids):
                raise RuntimeError(
                    f"{out.model} sent token index {t.index} of {t.rid}, expected {len(res.token_ids)}"
                )
            res.token_ids.extend(t.token_ids)
            res.models.extend([t.model] * len(t.token_ids))
            if t.hop_to is not None:
                res.hops.append((t.model, t.hop_to))
        for f in out.finished:
            if f.rid not in self.active:
                continue
            res = self.results[f.rid]
            res.finish_reason, res.error = f.reason, f.error
            self.active.discard(f.rid)
            for name in self.schedulers:
                self.queue.append((name, m.Release(f.rid)))
            if self.publish_active:
                self._publish_count()

    # ---- the loop ----------------------------------------------------------------------------------------

    def _deliver(self) -> None:
        while self.queue:
            dest, msg = self.queue.popleft()
            if dest == FRONTEND:
                self._on_outputs(msg)
            else:
                self.queue.extend(self.schedulers[dest].handle(msg))

    def round(self) -> None:
        """One scheduling round: deliver every queued message, then step each subserver that is ready (in
        plan order). When none is ready, advance the virtual clock to the earliest max_delay deadline;
        when there is none either and requests are active, raise StallError."""
        self._deliver()
        if not self.active:
            return
        ready = [s for s in self.schedulers.values() if s.ready()]
        if not ready:
            deadlines = [d for s in self.schedulers.values() if (d := s.next_deadline()) is not None]
            if not deadlines:
                raise StallError(self._describe_stall())
            self.clock.now = max(self.clock.now, min(deadlines))
            return
        for s in ready:
            with device_scope(getattr(s.engine, "device", None)):  # models on two GPUs in this process
                self.queue.extend(s.step())
            self.steps[s.model] += 1
            self._deliver()

    def run(self, max_rounds: int = 1_000_000) -> dict[str, RequestResult]:
        """Run until every submitted request has finished; returns the results by rid."""
        for _ in range(max_rounds):
            self.round()
            if not self.active:
                return self.results
        raise RuntimeError(
            f"requests still active after {max_rounds} scheduling rounds: {sorted(self.active)}"
        )

    def _describe_stall(self) -> str:
        parts = [
            f"{name}: threshold {s.batching.threshold}, runnable {len(s.runnable)}, {s.counts()}"
            for name, s in self.schedulers.items()
        ]
        return f"delayed batching stalled with {len(self.active)} active requests; " + "; ".join(parts)

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: m.SamplingSpec | Sequence[m.SamplingSpec]
    ) -> list[RequestResult]:
        """Submit every prompt at once, run to completion, return results in prompt order."""
        specs = list(sampling) if isinstance(sampling, Sequence) else [sampling] * len(prompts)
        base = len(self.results)
        rids = [f"req-{base + i}" for i in range(len(prompts))]
        for rid, prompt, spec in zip(rids, prompts, specs, strict=True):
            self.submit(rid, prompt, spec)
        self.run()
        return [self.results[rid] for rid in rids]


def load_offline(
    plan: dict, device: str | None = None, *, batching: BatchingConfig | None = None, **engine_overrides
) -> OfflineExecutor:
    """An executor with every model of the plan loaded in this process (device: as `serve` would place
    each model, unless `device` is given)."""
    from tokenrouter.runtime import threads
    from tokenrouter.runtime.subserver.loading import load_model_runtime, pick_device

    threads.set_torch_threads(len(plan["models"]))
    engines, kernels = {}, {}
    for name, spec in plan["models"].items():
        engines[name], kernels[name] = load_model_runtime(
            plan, name, pick_device(spec, device), **engine_overrides
        )
    return OfflineExecutor(plan, engines, kernels, batching=batching)


class PlanInputError(ValueError):
    """A plan or policy that cannot be used (the message is for users; for a .tr, the diagnostics)."""


def plan_from_path(path: str, defines: dict[str, str] | None = None) -> dict:
    """A plan from a .plan file, or from a .tr policy compiled on the fly (with -D `defines`)."""
    from tokenrouter.compiler.driver import load_plan
    from tokenrouter.compiler.plan import PlanError
    from tokenrouter.hub import HubError, resolve_models

    try:
        plan = load_plan(path, defines)
        resolve_models(plan, fetch=True, source=str(path))
    except (PlanError, HubError) as e:
        raise PlanInputError(str(e)) from None
    return plan


def generate_from_plan(
    path: str,
    *,
    prompt: str | None,
    prompt_ids: list[int] | None,
    sampling: m.SamplingSpec,
    device: str | None = None,
    defines: dict[str, str] | None = None,
) -> dict:
    """`tokenrouter generate PLAN`: one prompt through every model of the plan, in this process, with the
    same schedulers and routing as `serve`. Text prompts use the entry model's tokenizer. Returns a JSON-able
    dict: token_ids, text, finish_reason, per-token `models`, `pieces` (text of each token), hops, and
    tokens written per model. Raises PlanInputError / EngineError / ValueError with user-facing messages."""
    if (prompt is None) == (prompt_ids is None):
        raise ValueError("give exactly one of a text prompt or prompt token ids")
    plan = plan_from_path(path, defines)
    entry_dir = plan["models"][plan["entry"]]["path"]
    tokenizer, prompt_ids = (None, prompt_ids) if prompt is None else _tokenized(entry_dir, prompt)
    ex = load_offline(plan, device)
    _check_ids(ex, prompt_ids)
    (res,) = ex.generate([prompt_ids], sampling)
    if res.error:
        raise ValueError(res.error)
    text, pieces = _decoded(tokenizer, entry_dir, res.token_ids)
    return _generated(plan, prompt_ids, res, text, pieces)


def _tokenized(entry_dir: str, prompt: str) -> tuple[object, list[int]]:
    """The entry model's tokenizer and the prompt's token ids (a ValueError if there are none)."""
    from tokenrouter.runtime.engine.generate import load_tokenizer

    tokenizer = load_tokenizer(entry_dir)
    prompt_ids = tokenizer.encode(prompt).ids
    if not prompt_ids:
        raise ValueError("the prompt is empty after tokenization")
    return tokenizer, prompt_ids


def _generated(plan: dict, prompt_ids: list[int], res, text: str, pieces: list[str]) -> dict:
    """`generate_from_plan`'s JSON-able answer."""
    per_model = {name: res.models.count(name) for name in plan["models"]}
    return {
        "policy": plan["policy"]["name"],
        "prompt_token_ids": list(prompt_ids),
        "token_ids": res.token_ids,
        "text": text,
        "finish_reason": res.finish_reason,
        "models": res.models,
        "pieces": pieces,
        "hops": [list(h) for h in res.hops],
        "tokens_per_model": per_model,
    }


def _check_ids(ex: OfflineExecutor, prompt_ids: list[int]) -> None:
    """Every prompt token id is in every model's vocabulary."""
    vocab = min(s.engine.info.vocab_size for s in ex.schedulers.values())
    bad = [t for t in prompt_ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is out of range 0..{vocab - 1}")


def _decoded(tokenizer, entry_dir: str, token_ids: list[int]) -> tuple[str | None, list[str] | None]:
    """The tokens' text and each token's piece, by the entry model's tokenizer (`tokenizer`, or loaded from
    `entry_dir`); (None, None) where the model has no tokenizer.json."""
    from tokenrouter.runtime.engine.generate import load_tokenizer

    if tokenizer is None:
        try:
            tokenizer = load_tokenizer(entry_dir)
        except EngineError:  # no tokenizer.json: token ids only
            return None, None
    known = tokenizer.get_vocab_size()
    text = tokenizer.decode([t for t in token_ids if t < known], skip_special_tokens=True)
    pieces = [tokenizer.decode([t], skip_special_tokens=False) if t < known else "" for t in token_ids]
    return text, pieces
