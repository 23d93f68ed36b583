"""Host-side cost of one subserver step (issue 7: the 0.6B subserver spends ~1-1.5 ms per step outside the GPU).

Drives `Scheduler.step()` of the entry model of `bernoulli.tr` (p = 0.1, q = 1) on CPU with an engine whose
model step is instant: a real `EmbeddedEngine` (validation, KV allocation, request table, `ForwardBatch`
build) whose `_run_model` returns slices of precomputed logits [B, 151936] and hidden [B, 1024]. The route
kernel is stubbed by default (precomputed tokens; rule 0 fires with probability p), so only host work is
timed; `--kernel torch` runs the real torch route kernel on CPU instead. The peer model is played by the
benchmark: a hop comes back one step later with one token written by the peer, so ~10 % of the rows of a
step are 2-token extends. Each step also pays what the process's decode loop adds: decoding the peer's
`PeerRequest` (msgpack, as the decode loop does on receipt), `Scheduler.handle`, and msgpack-encoding every outgoing
message (`Subserver.dispatch`).

    python bench/subserver_host_bench.py [--rows 1,2,4,8] [--steps 3000] [--kernel stub|torch]
                                         [--compare REV] [--profile]

`--compare REV` also runs the scheduler and `HeldRequestsEngine` as they were at git revision REV (loaded
from `git show REV:path`) on the same inputs, interleaved with the current code, and prints both. Times are
µs per step (means over the measured steps); parts nest: "engine.forward" includes "validate", "fitting"
(allocation + ForwardBatch build + request bookkeeping) and "model" (the instant stand-in). What this CPU
run cannot show: on CUDA every pageable host-to-device copy and kernel launch costs ~5-20 µs of host time
(and a pageable copy may synchronise); those are counted here only as the CPU cost of the same calls.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import subprocess
import sys
import time
import types
from pathlib import Path

import msgspec
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tokenrouter.runtime import messages as m  # noqa: E402
from tokenrouter.runtime.engine.embedded import EmbeddedEngine, load_engine  # noqa: E402
from tokenrouter.runtime.route import RouteKernel, RouteResult  # noqa: E402
from tokenrouter.runtime.subserver.batching import BatchingConfig  # noqa: E402
from tokenrouter.runtime.subserver.scheduler import FRONTEND, Scheduler  # noqa: E402

VOCAB, HIDDEN = 151_936, 1024
TINY = str(ROOT / "examples/models/tiny-small")
PARTS = ("step", "engine.forward", "validate", "fitting", "model", "route_state", "kernel", "result",
         "peer_in", "encode")  # fmt: skip


class Timers:
    def __init__(self) -> None:
        self.us = dict.fromkeys(PARTS, 0.0)
        self.on = False

    def wrap(self, name: str, fn):
        us = self.us

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                us[name] += (time.perf_counter() - t0) * 1e6

        return timed


def make_plan() -> dict:
    from tokenrouter.compiler.driver import compile_file

    res = compile_file(ROOT / "tokenrouter/stdlib/bernoulli.tr", {"slm_path": TINY, "llm_path": TINY})
    if not res.ok:
        raise SystemExit("\n".join(str(d) for d in res.diagnostics))
    return res.plan


def make_engine(logits: torch.Tensor, hidden: torch.Tensor, held_cls=None) -> EmbeddedEngine:
    """A real EmbeddedEngine (pools, validation, ForwardBatch) on the tiny model's shape, told it has the
    0.6B's vocabulary, whose model step returns precomputed outputs at once. `held_cls`: a variant of
    `HeldRequestsEngine` to take the shared bookkeeping from (the `--compare` revision's)."""
    eng = load_engine(TINY, max_tokens=1 << 16, max_batch=64)
    eng.model_config = dataclasses.replace(eng.model_config, vocab_size=VOCAB)
    eng.info = dataclasses.replace(eng.info, vocab_size=VOCAB, hidden_size=HIDDEN)

    def _run_model(self, fb):
        return logits[: fb.batch_size], hidden[: fb.batch_size]

    eng._run_model = types.MethodType(_run_model, eng)
    if held_cls is not None:
        for name in ("forward", "_validate", "_forward_rows", "_make_room", "release", "seq_len"):
            setattr(eng, name, types.MethodType(held_cls.__dict__[name], eng))
    return eng


class StubKernel:
    """The route kernel's contract with precomputed results: greedy-like tokens, rule 0 with probability p."""

    needs_hidden = False

    def __init__(self, p: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        n = 1 << 16
        self.tokens = torch.from_numpy(rng.integers(0, VOCAB, n))
        self.rules = torch.from_numpy(np.where(rng.random(n) < p, 0, -1).astype(np.int32))
        self.logprob = torch.zeros(n)
        self.i = 0

    def __call__(self, logits, hidden, state) -> RouteResult:
        b = logits.shape[0]
        if self.i + b > len(self.tokens):
            self.i = 0
        s = slice(self.i, self.i + b)
        self.i += b
        return RouteResult(self.tokens[s], self.logprob[s], self.rules[s])


class Run:
    """One scheduler (current code or a revision's) and its peer stand-in, stepped one step at a time."""

    def __init__(self, label, sched_cls, held_cls, plan, rows, kernel) -> None:
        self.label = label
        self.t = Timers()
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(64, VOCAB, generator=g)
        hidden = torch.randn(64, HIDDEN, generator=g)
        eng = make_engine(logits, hidden, held_cls)
        if kernel == "stub":
            k = StubKernel(0.1, seed=rows)
        else:
            k = RouteKernel(plan, "slm", "torch", "cpu")
        cfg = BatchingConfig({"slm": 1, "llm": 1}, 0.0)
        s = sched_cls("slm", plan, eng, k, batching=cfg, max_batch=64)
        t = self.t
        eng.forward = t.wrap("engine.forward", eng.forward)
        eng._validate = t.wrap("validate", eng._validate)
        eng._forward_fitting = t.wrap("fitting", eng._forward_fitting)
        eng._run_model = t.wrap("model", eng._run_model)
        s.kernel = t.wrap("kernel", s.kernel)
        s._route_state = t.wrap("route_state", s._route_state)
        s.process_batch_result = t.wrap("result", s.process_batch_result)
        self.s = s
        self.enc = msgspec.msgpack.Encoder()
        self.dec = msgspec.msgpack.Decoder(m.ToSubserver)
        self.replies: list[bytes] = []
        self.peer_tok = 7
        self.steps = 0
        self.rows = 0
        sampling = m.SamplingSpec(max_tokens=10**6, ignore_eos=True, seed=1)
        for i in range(rows):
            prompt = [(i * 31 + j) % 1000 + 1 for j in range(32)]
            s.handle(m.NewRequest(f"r{i}", prompt, sampling, n_active=rows))

    def one(self) -> None:
        t, s = self.t, self.s
        t0 = time.perf_counter()
        for data in self.replies:  # the peer's hand-backs, as the decode loop receives them
            s.handle(self.dec.decode(data))
        self.replies.clear()
        t1 = time.perf_counter()
        before = s.steps
        out = s.step()
        t2 = time.perf_counter()
        frames = []
        for dest, msg in out:  # Subserver.dispatch
            data = self.enc.encode(msg)
            frames.append((dest, data))
        t3 = time.perf_counter()
        if t.on and s.steps > before:
            t.us["peer_in"] += (t1 - t0) * 1e6
            t.us["step"] += (t2 - t1) * 1e6
            t.us["encode"] += (t3 - t2) * 1e6
            self.steps += 1
            self.rows += s.last_batch_size
        for dest, msg in out:  # the peer writes one token and hands back (outside the timed region)
            if dest != FRONTEND:
                self.peer_tok = self.peer_tok * 7 % 1000 + 1
                seen = dict(msg.seen)
                back = m.PeerRequest(rid=msg.rid, origin="llm", start=seen["slm"], tokens=[self.peer_tok],
                                     prompt_len=msg.prompt_len, generated=msg.generated + 1,
                                     sampling=msg.sampling, n_active=msg.n_active, seen=seen)  # fmt: skip
                seen["llm"] = seen["slm"] + 1
                self.replies.append(self.enc.encode(back))


def load_revision(rev: str):
    """(Scheduler, HeldRequestsEngine) classes as they were at git revision `rev`."""
    mods = []
    for path, name in (("tokenrouter/runtime/subserver/scheduler.py", "scheduler"),
                       ("tokenrouter/runtime/engine/held.py", "held")):  # fmt: skip
        src = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout  # fmt: skip
        mod = types.ModuleType(f"_rev_{name}")
        mod.__dict__["__name__"] = f"_rev_{name}"
        sys.modules[mod.__name__] = mod  # dataclasses resolve annotations through sys.modules
        exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)
        mods.append(mod)
    return mods[0].Scheduler, mods[1].HeldRequestsEngine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--kernel", choices=("stub", "torch"), default="stub")
    ap.add_argument("--compare", metavar="REV", help="also run the code of git revision REV (the 'before')")
    ap.add_argument("--profile", action="store_true", help="cProfile the current code's steps (top 25)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    plan = make_plan()
    impls = [("now", Scheduler, None)]
    if args.compare:
        old_s, old_h = load_revision(args.compare)
        impls.insert(0, (args.compare[:10], old_s, old_h))
    print(f"µs per step, kernel={args.kernel}, {args.steps} steps per row count, torch {torch.__version__}")
    head = (
        f"| rows | code | mean rows | {' | '.join(PARTS)} | host (step - model - kernel + peer_in + encode) |"
    )
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for rows in [int(x) for x in args.rows.split(",")]:
        runs = [Run(label, sc, hc, plan, rows, args.kernel) for label, sc, hc in impls]
        for _ in range(args.warmup):
            for r in runs:
                r.one()
        for r in runs:
            r.t.on = True
        prof = cProfile.Profile() if args.profile else None
        for _ in range(args.steps):
            for r in runs:  # interleaved: the same machine load for both
                if prof is not None and r is runs[-1]:
                    prof.enable()
                    r.one()
                    prof.disable()
                else:
                    r.one()
        for r in runs:
            us = {k: v / max(r.steps, 1) for k, v in r.t.us.items()}
            host = us["step"] - us["model"] - us["kernel"] + us["peer_in"] + us["encode"]
            cells = " | ".join(f"{us[k]:.1f}" for k in PARTS)
            print(f"| {rows} | {r.label} | {r.rows / max(r.steps, 1):.2f} | {cells} | **{host:.1f}** |")
        if prof is not None:
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
