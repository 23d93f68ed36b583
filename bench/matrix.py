"""The serving matrix of issue 7: TokenRouter against its baselines (`serve --mode`), under the loadgen.

For one model pair and one policy, a *part* serves each mode in turn (`tokenrouter serve PLAN --mode M`, a
real deployment: launcher, frontend, subservers), warms it up, runs `tokenrouter bench` (closed loop,
concurrency N, `rounds x N` requests, fixed output length with `ignore_eos`, greedy) at each N, scrapes
/metrics, and stops it. Before that, `tokenrouter profile` measures the plan's step latencies L_i(b) (and
the routing p_ij) and `tokenrouter tune -n N` picks the delayed-batching thresholds per N and predicts the
throughput (the DTMC): the tokenrouter and no-graphs modes serve the tuned plan for their N, and the
summary sets measured against predicted.

Models: random-weight Qwen3 shapes (`make-model`, config only; the engine's `dummy` load fills bf16
weights on the GPU). Policies: the stdlib's `bernoulli` (p = 0.1, 0.35; q = 1), `r2r` (an untrained MLP
router from `init-router`) and `r_stitch` (entropy switching; no router).

    python bench/matrix.py --list                       # the named parts, what they run, rough time
    python bench/matrix.py --part 8b-bern0.1-targets --out $OUT
    python bench/matrix.py --pair 0.6b+8b --policy r2r --run tokenrouter:4,8 --run llm-only:4 --out $OUT
    python bench/matrix.py --cpu-smoke --out /tmp/smoke  # tiny models on CPU, a minute or two
    python bench/matrix.py --report results-*.tar.gz     # tables (markdown) and a chart from raw results

Each part writes under --out at most 5 files: `results-PART.tar.gz` (every raw file: a JSON record per
run with the loadgen report, the plan's thresholds, the prediction and /metrics; the profile, the tuning
records, the plans and every server's stderr), `summary-PART.md`, `summary-PART.json`, `chart-PART.png`
and `matrix-PART.log`. Exit status: 0 when every run completed, 1 when one failed (the others still run),
2 for bad usage. The commands behind each published figure are in docs/results.md.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import re
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # --report imports the throughput model from this checkout
    sys.path.insert(0, str(ROOT))
if str(ROOT / "bench") not in sys.path:  # its siblings, where it is loaded from its file rather than run
    sys.path.insert(0, str(ROOT / "bench"))

from served import Server, exit_on_sigterm, prom_values, stop_live  # noqa: E402

MODES = ("tokenrouter", "llm-only", "lockstep", "std-serving", "eager", "no-graphs")
TUNED = ("tokenrouter", "no-graphs")  # modes that serve the plan tuned for their N
MAX_LEN = 4096  # each model's context in the matrix's plans: a prompt and its output tokens
STDLIB_MAX_DELAY_MS = 5.0  # `serve { max_delay_ms }` of every stdlib policy (records before --max-delay-ms)


@dataclass(frozen=True)
class Pair:
    small: str  # make-model shape, or a model folder
    large: str
    mem: tuple[float, float]  # GPU memory shares (small, large); None on CPU
    # each model's GPU, or a tuple of GPUs: that model tensor-parallel over them
    gpus: tuple[int | tuple[int, ...], int | tuple[int, ...]] = (0, 0)


PAIRS = {
    "0.6b+8b": Pair("qwen3-0.6b", "qwen3-8b", (0.15, 0.7)),
    "0.6b+32b": Pair("qwen3-0.6b", "qwen3-32b", (0.12, 0.8)),
    "0.6b+8b-2gpu": Pair("qwen3-0.6b", "qwen3-8b", (0.8, 0.8), gpus=(0, 1)),
    "0.6b+32b-2gpu": Pair("qwen3-0.6b", "qwen3-32b", (0.8, 0.8), gpus=(0, 1)),
    # the 32B tensor-parallel over both GPUs, the 0.6B beside its rank 0 (docs/serving.md, "Tensor parallelism")
    "0.6b+32b-tp2": Pair("qwen3-0.6b", "qwen3-32b", (0.12, 0.8), gpus=(0, (0, 1))),
    "tiny": Pair(
        str(ROOT / "examples/models/tiny-small"), str(ROOT / "examples/models/tiny-large"), (0.5, 0.5)
    ),
}
POLICIES = {  # name -> (stdlib policy, -D defines)
    "bern0.1": ("bernoulli", {"p": "0.1", "q": "1.0"}),
    "bern0.35": ("bernoulli", {"p": "0.35", "q": "1.0"}),
    "r2r": ("r2r", {}),
    "r_stitch": ("r_stitch", {}),
}


@dataclass
class Part:
    pair: str
    policy: str
    runs: dict[str, tuple[int, ...]]  # mode -> concurrencies
    note: str = ""
    minutes: float = 0.0  # rough device time
    timed: str = ""  # how `minutes` was timed (the GPU and the part's arguments); "": an unmeasured guess
    output_len: int | None = None  # None: --output-len (512)
    rounds: int | None = None  # None: --rounds


# the issue's target ratios side by side: TR vs llm-only and lockstep at N = 4, vs eager at N = 8
TARGET_RUNS = {"tokenrouter": (4, 8), "llm-only": (4, 8), "lockstep": (4,), "eager": (8,)}


def _parts() -> dict[str, Part]:
    parts = {}
    for pol in POLICIES:
        parts[f"8b-{pol}-targets"] = Part(
            "0.6b+8b",
            pol,
            TARGET_RUNS,
            "the target ratios side by side: TR vs llm-only and lockstep at N=4, vs eager at N=8",
            6.2,
            "H200, bern0.1, --rounds 6",
        )
        parts[f"8b-{pol}-rest"] = Part(
            "0.6b+8b",
            pol,
            {
                "tokenrouter": (1, 16),
                "llm-only": (1, 16),
                "lockstep": (8,),
                "eager": (4,),
                "no-graphs": (4, 8),
                "std-serving": (4, 8),
            },
            "the rest of the 0.6B+8B matrix",
            7.5,
            "H200, bern0.1, --rounds 3, tuned on the isolated profile",
        )
        parts[f"32b-{pol}"] = Part(
            "0.6b+32b",
            pol,
            {"tokenrouter": (4,), "llm-only": (4,), "lockstep": (4,)},
            "0.6B+32B, N=4",
            4.6,
            "H200, bern0.1, --rounds 2, tuned on the isolated profile",
        )
    parts["8b-check"] = Part(
        "0.6b+8b",
        "bern0.1",
        {"tokenrouter": (4,), "llm-only": (4,), "lockstep": (4,), "std-serving": (4,)},
        "a first short GPU check of every code path (64 tokens, one round): run it before the others",
        4.0,
        output_len=64,
        rounds=1,
    )
    for pol in ("bern0.1", "bern0.35", "r2r"):
        parts[f"8b-2gpu-{pol}"] = Part(
            "0.6b+8b-2gpu",
            pol,
            TARGET_RUNS,
            "the target ratios with one model per GPU (kind nvidia-h200-x2)",
            6.5,
        )
    parts["32b-2gpu-bern0.1"] = Part(
        "0.6b+32b-2gpu",
        "bern0.1",
        TARGET_RUNS,
        "0.6B + 32B with one model per GPU, the target modes (kind nvidia-h200-x2)",
        7.0,
    )
    return parts


PARTS = _parts()


def part_output_len(part: Part, output_len: int) -> int:
    """The output tokens of a part's rows: its own, else `--output-len`, which the tiny CPU pair cuts from the
    default 512 to 32."""
    if part.output_len is not None:
        return part.output_len
    return 32 if part.pair == "tiny" and output_len == 512 else output_len


@dataclass
class Settings:
    out: Path
    work: Path
    device: str | None  # "cpu" for the smoke run; None: the plan's placement (CUDA)
    output_len: int = 512
    prompt_len: int = 32
    rounds: int = 2  # requests per run = rounds x N
    warmup_len: int = 16
    batch_sizes: str = "1,2,4,8,16"
    startup_timeout: float = 300.0
    deadline_s: float | None = None  # start no server after this many seconds of the part
    r2r_threshold: str | None = None
    r_stitch_threshold: str | None = None
    # r2r / r_stitch without an explicit threshold: calibrated so that the large model writes this share of
    # the tokens (`tokenrouter.training.calibrate`); None: the stdlib's default
    route_share: float | None = 0.1
    calibrate_prompts: int = 8  # x calibrate_len tokens per routed generation; the bisection runs ~11
    calibrate_len: int = 128  # (eager engines: ~18 ms per 0.6B step on the H200, served without graphs)
    serve_args: list[str] = field(default_factory=list)  # extra `serve` arguments (e.g. --mps-sm llm=70)
    # "eager" (default): step latencies from the plan served at B = 1 (`profile --from-metrics`), whose
    # predictions came within 0.88-1.09x of the measured tok/s on the H200; "profile": each model timed
    # alone, which misses the co-running slowdown (0.37-0.58x there). Where the models share a GPU, an eager
    # profile from a server with the busy board also holds each model's latencies alone and beside the other,
    # which `tune` then uses
    tune_from: str = "eager"
    profile_len: int = 256  # output tokens per request of the served profile's load
    # requests per N of the served profile's load = profile_rounds x N; None: `rounds`. A thicker profile alone
    # (`--profile-rounds 8`) reaches `profile_min_steps` at the large batch sizes of N = 16 without lengthening
    # the measured rows (a 4-round eager profile at N = 16 had the 8B at 11 rows or more in 19 steps)
    profile_rounds: int | None = None
    # `profile --from-metrics --min-steps`: a batch size's latency (every step, alone, beside) from at least
    # this many steps. 20, not the CLI's 5: re-tuned offline from six served runs' own scrapes (H200),
    # 20 put the served rows at 0.83-1.00x of the chain (standard deviation 0.046) against 0.88-1.19x (0.071)
    # with 5, whose few-step latencies alone (one profile had the 0.6B alone at b = 7 at 4.4 ms from 11 steps)
    # misled the choice; 15 and 25 chose as 20 did
    profile_min_steps: int = 20
    # TokenRouter served again at these fixed thresholds beside the tuned ones, each with the DTMC's
    # prediction from the same profile (`--thresholds`): does the model rank the candidates as serving does?
    thresholds: list[dict[str, int]] = field(default_factory=list)
    # the served profile a second time at these thresholds (`serve --batch`), and tune on the two with the
    # co-location term (`profile --colocation`); None: the eager profile alone
    colocation: dict[str, int] | None = None
    # the served profile a second time at these thresholds, whose latencies alone (the busy board's) replace the
    # eager profile's (`profile --from-metrics ... --alone`): an eager profile sees the small model alone only at
    # the few batch sizes it runs while the large one holds no request
    alone_from: dict[str, int] | None = None
    # the served profile a second time at these thresholds, whose latencies at every batch size it measured
    # (every step's, alone and beside) replace the eager profile's (`profile --from-metrics ... --merge`): there
    # the models run at the batch sizes and beside each other as a delayed-batching plan does
    served_from: dict[str, int] | str | None = None  # or "tuned": at the eager profile's choice, per N
    # `serve { max_delay_ms }` of the compiled plans: how long a request waits for its model's batch to reach
    # B_i (the DTMC has no such timeout)
    max_delay_ms: float = STDLIB_MAX_DELAY_MS
    # the measured rows as an open loop (`bench --request-rate`): requests arrive at this rate (Poisson, seeded)
    # with at most N in flight, a wait at that cap reported apart; None: a closed loop of N workers, as the
    # DTMC models (its checks are left out of an open loop's tables: its throughput is the offered load's)
    request_rate: float | None = None
    # with request_rate: tune for the lowest latency at that rate (`tune --request-rate`), not the chain's
    # closed-loop throughput
    tune_at_rate: bool = False
    slo_ttft_ms: float | None = (
        None  # with them, the report's goodput (`bench --slo-ttft-ms / --slo-tpot-ms`)
    )
    slo_tpot_ms: float | None = None
    # after each measured row, a second load of PROFILE_ROUNDS x N requests, not measured, under a live profile
    # of this many seconds (`serve --profile-dir`, bench/trace_summary.py): where each subserver's steps go
    profile_s: float | None = None
    profile_after_s: float = 1.5  # into that load, when every worker's request is decoding (tiny pair: 0)
    log: list[str] = field(default_factory=list)


# ---- helpers ------------------------------------------------------------------------------------------


def say(s: Settings, text: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {text}"
    print(line, flush=True)
    s.log.append(line)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenrouter.cli", *args]


def run_cmd(s: Settings, cmd: list[str], log: Path, timeout: float = 900.0) -> subprocess.CompletedProcess:
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=f, text=True, timeout=timeout)
        f.write(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:4])} failed (status {proc.returncode}); see {log.name}")
    return proc


def model_folder(s: Settings, shape: str) -> str:
    if Path(shape).is_dir():
        return shape
    from tokenrouter.runtime.engine.make_model import make_model, shape_for

    folder = s.work.parent / "models" / shape
    if not (folder / "config.json").is_file():
        make_model(folder, shape_for(shape), seed=0, weights=False, force=True)
    return str(folder)


def base_plan(s: Settings, pair_name: str, policy: str, raw: Path) -> Path:
    """The stdlib policy on this pair: placement, memory shares, dummy weights; untrained routers; r2r and
    r_stitch with the threshold given, else one calibrated to `s.route_share` (`calibrate_plan`)."""
    from tokenrouter.compiler.plan import write_plan
    from tokenrouter.runtime.route.routers import init_router_file

    stdlib = POLICIES[policy][0]
    given = {"r2r": s.r2r_threshold, "r_stitch": s.r_stitch_threshold}.get(stdlib)
    plan = compile_policy(s, pair_name, policy, raw, given)
    for router, entry in plan["routers"].items():
        init_router_file(plan, router, entry["path"], seed=0)
    if stdlib in ("r2r", "r_stitch") and given is None and s.route_share is not None:
        plan = compile_policy(s, pair_name, policy, raw, calibrate_plan(s, plan, raw))
    path = raw / f"{pair_name}-{policy}.plan"
    write_plan(plan, path)
    return path


def compile_policy(s: Settings, pair_name: str, policy: str, raw: Path, threshold: str | None) -> dict:
    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.compiler.passes.check_feasibility import feasibility

    pair = PAIRS[pair_name]
    stdlib, defines = POLICIES[policy]
    defines = dict(defines)
    small, large = model_folder(s, pair.small), model_folder(s, pair.large)
    names = ("base_path", "assistant_path") if stdlib == "co_llm" else ("slm_path", "llm_path")
    defines.update({names[0]: small, names[1]: large})
    if stdlib == "r2r":
        defines["router_path"] = str(raw / "r2r_router.safetensors")
    if threshold is not None:
        defines["threshold"] = threshold
    # the untrained routers are written after it (`base_plan`)
    res = compile_file(ROOT / "tokenrouter/stdlib" / f"{stdlib}.tr", defines, weights_check=False)
    if res.plan is None:
        raise RuntimeError(f"{stdlib}.tr did not compile: {[str(d) for d in res.diagnostics]}")
    plan = res.plan
    for (name, spec), gpu, mem, folder in zip(
        plan["models"].items(), pair.gpus, pair.mem, (small, large), strict=True
    ):
        spec["gpus"] = list(gpu) if isinstance(gpu, tuple) else [gpu]
        spec["max_len"] = MAX_LEN
        if s.device != "cpu":
            spec.update(
                mem=mem,
                dtype="bfloat16",
                load="dummy" if not Path(folder, "model.safetensors").exists() else "auto",
            )
        assert spec["path"] == folder, (name, spec["path"])
    plan["serve"]["max_delay_ms"] = s.max_delay_ms
    plan["checks"]["feasibility"] = feasibility(plan["models"], plan["serve"]["concurrency"])
    return plan


def calibrate_plan(s: Settings, plan: dict, raw: Path) -> str:
    """The threshold at which the plan, served in-process on the load generator's first prompts (greedy,
    as `bench` asks), has the large model write `s.route_share` of the tokens (`tokenrouter calibrate`, in
    its own process: this one holds no CUDA context while the subservers run; raw/calibration.json)."""
    from tokenrouter.compiler.plan import write_plan

    uncalibrated = raw / "uncalibrated.plan"
    write_plan(plan, uncalibrated)
    length = min(s.calibrate_len, s.output_len)
    dev = ["--device", s.device] if s.device else []
    t0 = time.perf_counter()
    proc = run_cmd(s, cli("calibrate", str(uncalibrated), "--share", str(s.route_share), "--json",
                          "--num-prompts", str(s.calibrate_prompts), "--prompt-len", str(s.prompt_len),
                          "--max-tokens", str(length), *dev), raw / "calibrate.log")  # fmt: skip
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    got.update(wanted_share=s.route_share, prompts=s.calibrate_prompts, tokens_each=length,
               seconds=time.perf_counter() - t0)  # fmt: skip
    (raw / "calibration.json").write_text(json.dumps(got, indent=1))
    say(s, f"calibrated threshold {got['threshold']:.6g} in {got['seconds']:.0f} s: the large model writes "
           f"{got['share']:.3f} of {got['positions']} tokens served in-process (at the threshold from the small "
           f"model's solo positions, {got['solo_threshold']:.6g}: {got['solo_share']:.3f})")  # fmt: skip
    if "warning" in got:
        say(s, f"calibration warning: {got['warning']}")
    return repr(got["threshold"])


def tune_load(s: Settings, profile: Path) -> tuple[str, ...]:
    """`tune`'s options for the load the part benchmarks: its requests' output length, which prices the profile's
    prompt prefills per request (the served profile's load has `profile_len` tokens per request); with
    `tune_at_rate`, its rate (`tune` then ranks the thresholds by the open loop's latency) and the hop delays and
    step gaps the profile measured, where it has them (`--hop-ms profile`, `--gap-ms profile`)."""
    rate: tuple[str, ...] = ()
    if s.tune_at_rate:
        rate = ("--request-rate", repr(s.request_rate))
        measured = json.loads(profile.read_text()).get("workload", {})
        for key, flag in (("hop_ms", "--hop-ms"), ("gap_ms", "--gap-ms")):
            if measured.get(key):
                rate += (flag, "profile")
    return ("--request-tokens", str(s.output_len), *rate)


def profile_and_tune(s: Settings, plan: Path, ns: list[int], raw: Path) -> dict[int, dict]:
    """`tokenrouter profile` once, then `tokenrouter tune -n N` per N: {N: {"plan", "thresholds",
    "predicted_tok_s"}}."""
    prof = raw / "profile.json"
    dev = ["--device", s.device] if s.device else []
    profiles = {n: prof for n in ns}
    if s.tune_from == "eager":
        profiles = profile_served(s, plan, ns, raw)
    else:
        say(s, f"profile {plan.name} (batch sizes {s.batch_sizes})")
        run_cmd(
            s,
            cli("profile", str(plan), "-o", str(prof), "--batch-sizes", s.batch_sizes, *dev),
            raw / "tune.log",
        )
    out = {}
    for n in ns:
        tuned = raw / f"{plan.stem}-n{n}.plan"
        if profiles.get(n) is None:  # profile_served could not read one at this N (its log says why)
            if n != 1:
                raise RuntimeError(f"no profile at N = {n}; see tune.log")
            out[1] = untuned_n1(s, plan, tuned)
            continue
        proc = run_cmd(
            s,
            cli(
                "tune",
                str(plan),
                "--profile",
                str(profiles[n]),
                "-n",
                str(n),
                "--json",
                "-o",
                str(tuned),
                *tune_load(s, profiles[n]),
            ),
            raw / "tune.log",
        )
        rec = json.loads(proc.stdout)
        (raw / f"tune-n{n}.json").write_text(json.dumps(rec, indent=2))
        result = rec["tuning"]["result"]
        out[n] = {"plan": tuned, "thresholds": result["best"], "predicted_tok_s": result["throughput_tok_s"],
                  "p": rec["tuning"]["p"], "step_ms": rec["tuning"]["step_ms"], "profile": profiles[n]}  # fmt: skip
        say(s, f"tune N={n}: {chosen(result)}")
        say_warnings(s, f"tune N={n}", rec["tuning"].get("warnings", []))
        if rec["tuning"].get("alone"):  # contention by state: what the plain chain would have chosen
            plain = plain_tune(s, plan, plain_profile(profiles[n]), n, raw)
            who = "without them the rate tuner" if "objective" in plain else "the plain chain"
            say(s, f"tune N={n} by state (latencies alone of {', '.join(rec['tuning']['alone'])}); {who} would "
                   f"choose {chosen(plain)}")  # fmt: skip
    return out


def chosen(result: dict) -> str:
    """A tuning's result in words: its B and the chain's predicted throughput, or (`tune --request-rate`) the
    simulated latency it was chosen by."""
    if "objective" in result:
        return (f"B = {result['best']} (simulated {result['objective']} {result['score_ms']:.0f} ms at "
                f"{result['request_rate_per_s']:g} requests/s)")  # fmt: skip
    return f"B = {result['best']} (predicted {result['throughput_tok_s']:.0f} tok/s)"


def say_warnings(s: Settings, what: str, warnings: list[str]) -> None:
    """`tune`'s warnings (a B_i beyond the profile, a timeout too short to fill a batch) on the console, not
    only in tune.log."""
    for warning in warnings:
        say(s, f"{what}: warning: {warning}")


def plain_profile(profile: Path) -> Path:
    """A copy of a profile without its latencies alone (contention by state), beside it."""
    data = json.loads(profile.read_text())
    data.pop("alone_ms", None)
    data.pop("beside_ms", None)
    out = profile.with_name(profile.stem + "-plain.json")
    out.write_text(json.dumps(data, indent=2))
    return out


def plain_tune(s: Settings, plan: Path, profile: Path, n: int, raw: Path, name: str = "plain") -> dict:
    """`tune` on `profile` into tune-nN-NAME.json (its plan beside): the tuning's result."""
    rec = json.loads(run_cmd(s, cli("tune", str(plan), "--profile", str(profile), "-n", str(n), "--json",
                                    "-o", str(raw / f"{plan.stem}-n{n}-{name}.plan"), *tune_load(s, profile)),
                              raw / "tune.log").stdout)  # fmt: skip
    (raw / f"tune-n{n}-{name}.json").write_text(json.dumps(rec, indent=2))
    return rec["tuning"]["result"]


def profile_served(s: Settings, plan: Path, ns: list[int], raw: Path) -> dict[int, Path | None]:
    """Profiles from the models running side by side: serve the plan with B = 1 (eager), put N clients
    on it, and read step latencies and hop rates from its /metrics (`profile --from-metrics`), per N
    (None where `profile` failed: its message is in tune.log). With `s.colocation`, the same again with the
    plan served at those thresholds, and the profile per N is the two fitted into one with the co-location
    term (`profile --colocation`); where the fit fails, the eager profile alone (tune.log says why). With
    `s.alone_from` / `s.served_from`, the eager profile with the latencies alone / the latencies of the plan
    served at those thresholds (`lent_profile`)."""
    out = served_profiles(s, plan, ns, raw, "eager", ())
    if s.alone_from:
        return lent_profile(s, plan, ns, raw, out, s.alone_from, "--alone")
    if s.served_from:
        return lent_profile(s, plan, ns, raw, out, s.served_from, "--merge")
    if not s.colocation:
        return out
    label, second = served_at(s, plan, ns, raw, s.colocation)
    for n in ns:
        if out.get(n) is None or second.get(n) is None:
            continue
        fitted = raw / f"profile-n{n}-colocated.json"
        try:
            proc = run_cmd(s, cli("profile", str(plan), "--colocation", str(out[n]), "--colocation",
                                  str(second[n]), "-o", str(fitted)), raw / "tune.log")  # fmt: skip
        except RuntimeError as exc:
            say(s, f"co-location N={n}: {exc}; tuning on the eager profile alone")
            continue
        result = plain_tune(s, plan, plain_profile(out[n]), n, raw)
        terms = "; ".join(ln.strip() for ln in proc.stdout.splitlines() if "per unit of" in ln)
        say(
            s,
            f"co-location N={n} (eager and {label}): {terms}; without it tune would choose {chosen(result)}",
        )
        out[n] = fitted
    return out


def served_at(s: Settings, plan: Path, ns: list[int], raw: Path, thresholds: dict[str, int]):
    """(the thresholds as text, `served_profiles` of the plan served at them: `serve --batch MODEL=B ...`),
    the second profile of `--colocation`, `--alone-from` and `--served-from`."""
    label = threshold_label(thresholds)
    extra = tuple(x for m, b in thresholds.items() for x in ("--batch", f"{m}={b}"))
    return label, served_profiles(s, plan, ns, raw, f"B-{label.replace('=', '')}", extra)


TWO_PASS = "tuned"  # `--served-from tuned`: the second profile served at the eager profile's choice, per N

# profile's flag: (the lent profile's file suffix, what it lends, the name of the tuning without the loan)
LENT = {
    "--alone": ("alone", "latencies alone", "eager-alone"),
    "--merge": ("merged", "latencies", "eager-unmerged"),
}


def lent_profile(s: Settings, plan: Path, ns: list[int], raw: Path, out: dict[int, Path | None], thresholds,
                 flag: str):  # fmt: skip
    """The plan served a second time at `thresholds`, and per N the eager profile built again from its scrapes
    with that profile's latencies alone (`flag` "--alone": `profile --from-metrics ... --alone`) or its latencies
    at every batch size it measured ("--merge"), logged with what the eager profile alone would choose; where a
    step fails, the eager profile as it was (the log says why). `thresholds` "tuned": tuning in two passes, the
    second profile served per N at the thresholds the eager profile chooses."""
    suffix, what, own_name = LENT[flag]
    own = {n: plain_tune(s, plan, out[n], n, raw, own_name) for n in ns if out.get(n) is not None}
    eager_chosen = set()  # two passes: the N whose first pass chose B = 1 (the eager profile is that profile)
    if thresholds == TWO_PASS:
        second, labels = {}, {}
        for n in own:
            if set(own[n]["best"].values()) == {1}:
                eager_chosen.add(n)
                say(s, f"{what} N={n}: the eager profile chooses B = 1; tuning on it")
                continue
            labels[n], got = served_at(s, plan, [n], raw, own[n]["best"])
            second[n] = got.get(n)
    else:
        label, second = served_at(s, plan, ns, raw, thresholds)
        labels = dict.fromkeys(ns, label)
    for n in ns:
        if n in eager_chosen:
            continue
        if out.get(n) is None or second.get(n) is None:
            say(s, f"{what} N={n}: no profile at {labels.get(n, 'the eager choice')} or no eager one; tuning on "
                   "the eager profile")  # fmt: skip
            continue
        lent = raw / f"profile-n{n}-{suffix}.json"
        try:
            run_cmd(s, cli("profile", str(plan), "--from-metrics", str(raw / f"profile-metrics-n{n}-after.txt"),
                           "--since", str(raw / f"profile-metrics-n{n}-before.txt"), "--min-steps",
                           str(s.profile_min_steps), flag, str(second[n]), "-o", str(lent)), raw / "tune.log")  # fmt: skip
        except RuntimeError as exc:
            say(s, f"{what} N={n}: {exc}; tuning on the eager profile")
            continue
        say(s, f"{what} N={n} from the plan served at {labels[n]}; with the eager profile's own, tune would "
               f"choose {chosen(own[n])}")  # fmt: skip
        out[n] = lent
    return out


def served_profiles(s: Settings, plan: Path, ns: list[int], raw: Path, tag: str, extra: tuple[str, ...]):
    """profile_served's profiles of one server: `--mode eager`, or `tokenrouter` with `extra` arguments."""
    import httpx

    mode, suffix = ("eager", "") if tag == "eager" else ("tokenrouter", f"-{tag}")
    say(s, f"profile {plan.name} from serving metrics ({tag}, N = {ns})")
    srv = start_server(s, plan, mode, raw / f"serve-profile{suffix}.stderr", extra)
    out = {}
    try:
        for n in ns:
            bench(s, srv.url, n, n, s.warmup_len, None, raw / "bench.log")
            time.sleep(1.0)
            before = raw / f"profile-metrics-n{n}{suffix}-before.txt"
            before.write_text(httpx.get(f"{srv.url}/metrics", timeout=30).text)
            # tuning at a rate: the profile's load at that rate too (an eager closed loop seldom leaves the large
            # model a step alone, so its latencies alone go unmeasured)
            rate = s.request_rate if s.tune_at_rate else None
            bench(
                s,
                srv.url,
                n,
                (s.profile_rounds or s.rounds) * n,
                s.profile_len,
                None,
                raw / "bench.log",
                rate,
            )
            time.sleep(1.0)
            after = raw / f"profile-metrics-n{n}{suffix}-after.txt"
            after.write_text(httpx.get(f"{srv.url}/metrics", timeout=30).text)
            out[n] = raw / f"profile-n{n}{suffix}.json"
            try:
                run_cmd(s, cli("profile", str(plan), "--from-metrics", str(after), "--since", str(before),
                               "--min-steps", str(s.profile_min_steps), "-o", str(out[n])), raw / "tune.log")  # fmt: skip
            except RuntimeError as exc:  # e.g. a policy at a low share: the large model stepped too rarely
                say(s, f"profile N={n}: {exc}")
                out[n] = None
    finally:
        srv.stop()
    return out


def out_of_time(deadline_s: float | None, elapsed_s: float, row_s: float, rows: int) -> str | None:
    """Why a server for `rows` rows must not start `elapsed_s` into a part with `--deadline-s`, where the longest row
    so far took `row_s` (None: it may start). A part's last row once started 8 s inside the deadline and ran
    past the part's `timeout`."""
    if deadline_s is None:
        return None
    if elapsed_s > deadline_s:
        return f"the part passed --deadline-s {deadline_s:g}"
    if elapsed_s + row_s * rows > deadline_s:
        return (f"{deadline_s - elapsed_s:.0f} s left of --deadline-s {deadline_s:g}, and a row has taken "
                f"{row_s:.0f} s")  # fmt: skip
    return None


def untuned_n1(s: Settings, plan: Path, tuned: Path) -> dict:
    """N = 1 without a profile: Σ(B_i − 1) < N leaves B = 1 for every model, so there is nothing to tune;
    the plan is served eager and the run has no DTMC prediction (its own-step-time check still runs)."""
    from tokenrouter.compiler.plan import read_plan, write_plan
    from tokenrouter.runtime.modes import with_thresholds

    data = with_thresholds(read_plan(plan), 1)
    write_plan(data, tuned)
    thresholds = dict.fromkeys(data["models"], 1)
    say(s, f"tune N=1: B = {thresholds} (the only feasible thresholds), no prediction without a profile")
    return {"plan": tuned, "thresholds": thresholds, "predicted_tok_s": None, "p": None, "step_ms": None,
            "profile": None}  # fmt: skip


def threshold_label(thresholds: dict[str, int]) -> str:
    return ",".join(f"{m}={b}" for m, b in thresholds.items())


def fixed_tuning(s: Settings, plan: Path, n: int, given: dict[str, int], tuned: dict, raw: Path) -> dict:
    """The plan at fixed thresholds `given` (models not named keep the tuned B), with the DTMC's prediction
    on the profile the tuning used: `tokenrouter tune` on a plan without auto models evaluates just that
    candidate. Like profile_and_tune's entries, plus "fixed": True."""
    from tokenrouter.compiler.passes.check_feasibility import feasibility_error
    from tokenrouter.compiler.plan import read_plan, write_plan
    from tokenrouter.runtime.modes import with_thresholds

    data = read_plan(plan)
    unknown = sorted(set(given) - set(data["models"]))
    if unknown:
        raise RuntimeError(
            f"--thresholds names {unknown[0]!r}, not a model of the plan ({', '.join(data['models'])})"
        )
    thresholds = {m: int(given.get(m, tuned["thresholds"][m])) for m in data["models"]}
    err = feasibility_error(thresholds, n)
    if err:
        raise RuntimeError(f"thresholds {threshold_label(thresholds)} are infeasible at N = {n}: {err}")
    data["serve"]["concurrency"] = n
    data = with_thresholds(data, thresholds)
    stem = f"{plan.stem}-n{n}-B" + "-".join(str(b) for b in thresholds.values())
    fixed = raw / f"{stem}.plan"
    write_plan(data, fixed)
    out = {"plan": fixed, "thresholds": thresholds, "predicted_tok_s": None, "p": tuned["p"],
           "step_ms": tuned["step_ms"], "profile": tuned["profile"], "fixed": True}  # fmt: skip
    warnings = []  # tune's, where there is a profile to predict on
    if tuned["profile"] is not None:
        proc = run_cmd(s, cli("tune", str(fixed), "--profile", str(tuned["profile"]), "-n", str(n), "--json",
                              "-o", str(fixed), *tune_load(s, tuned["profile"])), raw / "tune.log")  # fmt: skip
        rec = json.loads(proc.stdout)
        (raw / f"tune-{stem}.json").write_text(json.dumps(rec, indent=2))
        out["predicted_tok_s"] = rec["tuning"]["result"]["throughput_tok_s"]
        warnings = rec["tuning"].get("warnings", [])
        say(s, f"fixed N={n}: {chosen(rec['tuning']['result'])}")
    else:
        say(s, f"fixed N={n}: B = {thresholds}, no prediction without a profile")
    say_warnings(s, f"fixed N={n}", warnings)
    return out


def start_server(s: Settings, plan: Path, mode: str, log: Path, extra: tuple[str, ...] = ()) -> Server:
    """`tokenrouter serve PLAN --mode MODE` with the matrix's settings, in its own session (bench/served.py)."""
    dev = ["--device", s.device] if s.device else []
    args = ["--mode", mode, "--startup-timeout", str(s.startup_timeout), *dev, *s.serve_args, *extra]
    return Server(plan, args, log, s.startup_timeout + 30)


def scrape(url: str) -> dict[str, float]:
    import httpx

    # uptime and the thresholds too: `--record-profile` makes a co-location profile of a served run; the requests
    # that ended and those each model reached price its prompt prefills per request (older servers lack those
    # counters)
    keep = ("step_", "steps_", "generation_tokens_total", "hops_total", "hops_in_total", "hop_delay_", "prefix_",
            "uptime_seconds_total", "batch_threshold", "kernel_load", "requests_visiting_total",
            "e2e_request_latency_seconds_count")  # fmt: skip
    values = prom_values(httpx.get(f"{url}/metrics", timeout=30).text)
    return {key: value for key, value in values.items() if any(k in key for k in keep)}


def bench(
    s: Settings, url: str, n: int, num: int, length: int, json_out: Path | None, log: Path,
    rate: float | None = None,
) -> dict | None:  # fmt: skip
    """`tokenrouter bench` on the server at `url`: N at a time, `num` requests of `length` tokens. The measured
    rows (`json_out`) run at the part's rate and SLOs; another load is a closed loop, or an open loop at `rate`."""
    cmd = cli("bench", "--url", url, "-c", str(n), "-n", str(num), "--output-len", str(length),
              "--prompt-len", str(s.prompt_len), "--temperature", "0", "--no-progress")  # fmt: skip
    flags = (("--request-rate", rate),)
    if json_out is not None:  # the measured rows; the warm-up is a closed loop
        cmd += ["--json", str(json_out)]
        flags = (("--request-rate", s.request_rate), ("--slo-ttft-ms", s.slo_ttft_ms),
                 ("--slo-tpot-ms", s.slo_tpot_ms))  # fmt: skip
    for flag, value in flags:
        if value is not None:
            cmd += [flag, f"{value:g}"]
    run_cmd(s, cmd, log, timeout=1800)
    return json.loads(json_out.read_text()) if json_out is not None else None


PROFILE_ROUNDS = 2  # the profiled load: PROFILE_ROUNDS x N requests of --output-len tokens


def profiled_load(s: Settings, url: str, n: int, log: Path, keep: Path | None = None) -> dict | str:
    """A closed loop of PROFILE_ROUNDS x N requests, N at a time, profiled for `s.profile_s` seconds (or
    until it ends) from `s.profile_after_s` into it: each subserver's `trace_summary` (model -> figures), or
    why none. `keep`: a folder for each subserver's table of ops (`ops-MODEL.txt`, small; the traces are not)."""
    import threading

    import httpx

    from bench.trace_summary import load_events, summarize

    failed: list[BaseException] = []

    def load() -> None:
        try:
            bench(s, url, n, PROFILE_ROUNDS * n, s.output_len, None, log)
        except BaseException as e:  # noqa: BLE001 - raised again below, in this thread
            failed.append(e)

    worker = threading.Thread(target=load)
    worker.start()
    time.sleep(s.profile_after_s)
    try:
        httpx.post(f"{url}/start_profile", timeout=60).raise_for_status()
        worker.join(s.profile_s)
        stopped = httpx.post(f"{url}/stop_profile", timeout=300)
        stopped.raise_for_status()
        files = stopped.json()["files"]
    except httpx.HTTPError as e:
        files = f"the profile failed: {e}"
    worker.join()
    if failed:
        raise failed[0]
    if isinstance(files, str):
        say(s, f"  {files}")
        return files
    first: dict[
        str, str
    ] = {}  # trace -> the first model it answers for (lockstep: one trace for every model)
    for model, paths in files.items():
        if first.setdefault(paths[0], model) == model and keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            (keep / f"ops-{model}.txt").write_bytes(Path(paths[1]).read_bytes())
    return {model: summarize(load_events(Path(trace))) for trace, model in first.items()}


# ---- one part ---------------------------------------------------------------------------------------------


def _num(x: float | None, spec: str) -> str:
    """A report's figure, or "-" where it has none (null or NaN in the loadgen's JSON: a percentile
    of no completed request)."""
    return "-" if x is None or x != x else format(x, spec)


def plan_committed(plan_path: Path) -> dict[str, dict[str, float]]:
    """The share of each transition's hops that keep their token (0: `drop`), from the plan's rules: what
    the DTMC on a run's own step times needs besides the metrics (the oldest records lack it: all their
    policies kept every token)."""
    from tokenrouter.throughput.policy import policy_routing

    return policy_routing(json.loads(plan_path.read_text())).keep


def run_part(s: Settings, name: str, part: Part) -> tuple[list[dict], list[str]]:
    raw = s.work / f"raw-{name}"
    raw.mkdir(parents=True, exist_ok=True)
    t_part = time.monotonic()
    say(s, f"part {name}: {part.pair}, {part.policy}: {part.runs}")
    plan = base_plan(s, part.pair, part.policy, raw)
    committed = plan_committed(plan)
    tuned_ns = sorted({n for mode, ns in part.runs.items() if mode in TUNED for n in ns})
    tuning = profile_and_tune(s, plan, tuned_ns, raw) if tuned_ns else {}
    records, failures = [], []
    # (mode, Ns, {N: tuning entry} or None): one server per entry; the tuned modes serve their N's plan
    servers: list[tuple[str, tuple[int, ...], dict[int, dict] | None]] = []
    for mode, ns in part.runs.items():
        if mode in TUNED:
            servers += [(mode, (n,), {n: tuning[n]}) for n in ns]
        else:
            servers.append((mode, tuple(ns), None))
    for given in s.thresholds:
        for n in part.runs.get("tokenrouter", ()):
            try:
                servers.append(("tokenrouter", (n,), {n: fixed_tuning(s, plan, n, given, tuning[n], raw)}))
            except RuntimeError as e:
                failures.append(f"tokenrouter N={n} at {threshold_label(given)}: {e}")
                say(s, f"FAILED tokenrouter N={n} at {threshold_label(given)}: {e}")
    row_s = 0.0  # the longest one N's row has taken so far, its server's start and stop included
    for mode, ns, tuned in servers:
        fixed = tuned is not None and tuned[ns[0]].get("fixed", False)
        plan_path = tuned[ns[0]]["plan"] if tuned is not None else plan
        variant = "-B" + "-".join(str(b) for b in tuned[ns[0]]["thresholds"].values()) if fixed else ""
        tag = f"{mode}-n{'-'.join(map(str, ns))}{variant}"
        finish(s, name, records, failures, quiet=True)  # what is done so far survives a killed command
        if why := out_of_time(s.deadline_s, time.monotonic() - t_part, row_s, len(ns)):
            failures.append(f"{tag}: skipped, {why}")
            say(s, f"SKIPPED {tag}: {why}")
            continue
        t_server = time.monotonic()
        try:
            traces = s.work / f"traces-{tag}"  # outside raw-*: the results archive leaves them out
            extra = ("--profile-dir", str(traces)) if s.profile_s else ()
            srv = start_server(s, plan_path, mode, raw / f"serve-{tag}.stderr", extra)
        except RuntimeError as e:
            failures.append(f"{tag}: {e}")
            say(s, f"FAILED {tag}: {e}")
            continue
        try:
            say(s, f"serving {mode} ({plan_path.name}) after {srv.startup_s:.1f} s")
            for n in ns:
                bench(s, srv.url, n, n, s.warmup_len, None, raw / "bench.log")  # compile kernels, fill graphs
                time.sleep(1.0)  # the subservers' stats (every 0.5 s) catch up with the warm-up
                before = scrape(srv.url)
                report = bench(s, srv.url, n, s.rounds * n, s.output_len, raw / f"bench-{mode}-n{n}{variant}.json",
                               raw / "bench.log")  # fmt: skip
                rec = {
                    "part": name, "pair": part.pair, "policy": part.policy, "mode": mode, "n": n,
                    "output_len": s.output_len, "prompt_len": s.prompt_len, "requests": s.rounds * n,
                    "device": s.device or "cuda",
                    "startup_s": srv.startup_s, "report": report, "metrics_before": before,
                    "metrics_after": (time.sleep(1.0), scrape(srv.url))[1],
                    "thresholds": tuned[n]["thresholds"] if tuned else None,
                    "predicted_tok_s": tuned[n]["predicted_tok_s"] if mode == "tokenrouter" else None,
                    "tuning_p": tuned[n]["p"] if tuned else None,
                    "committed": committed, "fixed_thresholds": fixed, "max_delay_ms": s.max_delay_ms,
                    "request_rate": s.request_rate,
                }  # fmt: skip
                if s.profile_s:
                    rec["trace"] = profiled_load(
                        s, srv.url, n, raw / "bench.log", raw / f"profile-{mode}-n{n}{variant}"
                    )
                (raw / f"record-{mode}-n{n}{variant}.json").write_text(json.dumps(rec, indent=2))
                records.append(rec)
                tok = report["decode_throughput_tok_s"]
                say(s, f"  {mode}{variant} N={n}: {tok:.1f} tok/s, tokens {report['tokens_per_model']}, "
                       f"failed {report['failed']}")  # fmt: skip
                if report["failed"]:
                    failures.append(f"{mode} N={n}: {report['failed']} requests failed: {report['errors']}")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            failures.append(f"{tag}: {e}")
            say(s, f"FAILED {tag}: {e}")
        finally:
            srv.stop()
        row_s = max(row_s, (time.monotonic() - t_server) / len(ns))
    say(s, f"part {name} done in {time.monotonic() - t_part:.0f} s")
    return records, failures


# ---- tables and chart ---------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


ENTRY = "slm"  # the entry model of every pair's plans (the stdlib policies' small model)
SHARE_GAP = 0.02  # a TR / mode ratio whose two runs gave the large models shares further apart is flagged


def large_share(rec: dict) -> float | None:
    """The share of the run's tokens written by models other than ENTRY (None when ENTRY wrote none:
    llm-only)."""
    tokens = rec["report"]["tokens_per_model"]
    total = sum(tokens.values())
    return 1.0 - tokens[ENTRY] / total if total and tokens.get(ENTRY) else None


def share_ratio(tr: dict | None, other: dict | None) -> str:
    """TR / other, with both large-model shares where they differ by more than SHARE_GAP (a ratio of runs
    that did not do the same work)."""
    if tr is None or other is None:
        return "-"
    text = ratio(tr["report"]["decode_throughput_tok_s"], other["report"]["decode_throughput_tok_s"])
    a, b = large_share(tr), large_share(other)
    if a is not None and b is not None and abs(a - b) > SHARE_GAP:
        text += f" (shares {100 * a:.1f} / {100 * b:.1f} %)"
    return text


def tables(records: list[dict]) -> str:
    out = []
    seen: dict[tuple[int, object], float | None] = {}

    def once(model, rec: dict) -> float | None:
        """`model(rec)`, computed once per record (the summary's checks and the threshold table share them)."""
        key = (id(rec), model)
        if key not in seen:
            seen[key] = model(rec)
        return seen[key]

    groups: dict[tuple[str, str, float], list[dict]] = {}
    for r in records:  # records without a request rate: closed loops (rate inf)
        groups.setdefault((r["pair"], r["policy"], r.get("request_rate") or math.inf), []).append(r)
    for (pair, policy, rate), every in sorted(groups.items()):
        recs = [r for r in every if not r.get("fixed_thresholds")]  # one record per (mode, N)
        if not recs:
            continue
        ns = sorted({r["n"] for r in recs})
        modes = [m for m in MODES if any(r["mode"] == m for r in recs)]
        tok = {(r["mode"], r["n"]): r["report"]["decode_throughput_tok_s"] for r in recs}
        by = {(r["mode"], r["n"]): r for r in recs}
        prompt = recs[0].get("prompt_len", 32)  # records before --prompt-len: 32
        load = "" if math.isinf(rate) else f"; an open loop of {rate:g} requests/s, at most N in flight"
        out.append(f"### {pair}, {policy} (decode tok/s; {prompt}-token prompts, {recs[0]['output_len']} tokens per "
                   f"request{load})\n")  # fmt: skip
        out.append("| mode | " + " | ".join(f"N={n}" for n in ns) + " |")
        out.append("| --- |" + " ---: |" * len(ns))
        for m in modes:
            out.append(
                f"| {m} | " + " | ".join(f"{tok[(m, n)]:.1f}" if (m, n) in tok else "-" for n in ns) + " |"
            )
        rows = [("TR / llm-only", "llm-only"), ("TR / lockstep", "lockstep"), ("TR / eager", "eager"),
                ("TR / std-serving", "std-serving"), ("TR / no-graphs", "no-graphs")]  # fmt: skip
        for label, m in rows:
            if m in modes:
                out.append(
                    f"| {label} | "
                    + " | ".join(share_ratio(by.get(("tokenrouter", n)), by.get((m, n))) for n in ns)
                    + " |"
                )
        if "tokenrouter" in modes:
            shares = [large_share(by[("tokenrouter", n)]) if ("tokenrouter", n) in by else None for n in ns]
            out.append(
                "| large-model share (TR) | "
                + " | ".join(f"{100 * x:.1f} %" if x is not None else "-" for x in shares)
                + " |"
            )
        if not math.isinf(rate):  # the DTMC and the simulator model a closed loop: no checks of an open one
            out.append("")
            out.extend(latency_table(every, once))
            out.extend(time_table(every))
            out.extend(trace_table(every))
            continue
        pred = {
            r["n"]: r["predicted_tok_s"] for r in recs if r["mode"] == "tokenrouter" and r["predicted_tok_s"]
        }
        checks = [("DTMC on the run's own step times", run_prediction),
                  ("DTMC on the run's own step times and host gaps", run_gap_prediction),
                  ("simulated as the run was (its requests, each with its own routing)", run_simulation),
                  ("simulated as the run was, with its hops' measured delay", run_hop_simulation),
                  ("simulated as the run was, with its hops' delay and host gaps", run_gap_simulation)]  # fmt: skip
        for label, model in checks:
            from_run = {(r["mode"], r["n"]): once(model, r) for r in recs}
            for m in ("tokenrouter", "eager"):
                if any(from_run.get((m, n)) for n in ns):
                    out.append(
                        f"| {label} ({m}) | "
                        + " | ".join(f"{from_run[(m, n)]:.1f}" if from_run.get((m, n)) else "-" for n in ns)
                        + " |"
                    )
                    out.append(
                        f"| measured / that ({m}) | "
                        + " | ".join(ratio(tok.get((m, n)), from_run.get((m, n))) for n in ns)
                        + " |"
                    )
        if pred:
            out.append(
                "| DTMC predicted (TR) | "
                + " | ".join(f"{pred[n]:.1f}" if n in pred else "-" for n in ns)
                + " |"
            )
            out.append(
                "| measured / predicted | "
                + " | ".join(ratio(tok.get(("tokenrouter", n)), pred.get(n)) for n in ns)
                + " |"
            )
        out.append("")
        out.append(
            "| mode | N | TTFT p50 ms | TPOT p50 ms | E2E p50 / p99 s | drain s | tokens per model | hops | B | "
            "start s |"
        )
        out.append("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: |")
        for r in sorted(recs, key=lambda r: (MODES.index(r["mode"]), r["n"])):
            rep = r["report"]
            # the oldest reports have no drain
            drain = f"{rep['drain_s']:.2f}" if "drain_s" in rep else "-"
            out.append(
                f"| {r['mode']} | {r['n']} | {_num(rep['ttft_ms']['p50'], '.1f')} | "
                f"{_num(rep['tpot_ms']['p50'], '.2f')} | "
                f"{_num(rep['e2e_s'].get('p50'), '.2f')} / {_num(rep['e2e_s']['p99'], '.2f')} | {drain} | "
                f"{rep['tokens_per_model']} | {rep['hops']} | "
                f"{r['thresholds'] or '-'} | {r['startup_s']:.0f} |"
            )
        out.append("")
        out.extend(threshold_table(every, once))
        out.extend(time_table(every))
        out.extend(trace_table(every))
    return "\n".join(out)


def latency_table(recs: list[dict], once=lambda model, rec: model(rec)) -> list[str]:
    """An open loop's rows (`--request-rate`), each served threshold's too: the requests per second served
    against those offered, the latencies' p50 / p99, the wait at the concurrency cap (not in TTFT or E2E), and
    the goodput where the run had an SLO."""

    def spread(rep: dict, key: str, spec: str) -> str:
        return f"{_num(rep[key]['p50'], spec)} / {_num(rep[key]['p99'], spec)}"

    def from_arrival(rep: dict) -> str:
        """Queued + E2E per request (reports without from_arrival_s: from per_request)."""
        if "from_arrival_s" in rep:
            return spread(rep, "from_arrival_s", ".2f")
        from tokenrouter.loadgen.bench import _spread

        waited = [r["queued_s"] + r["e2e_s"] for r in rep.get("per_request", []) if r["ok"]]
        return spread({"x": _spread(waited)}, "x", ".2f")

    rows, sims = [], []
    for r in sorted(recs, key=lambda r: (MODES.index(r["mode"]), r["n"], mode_label(r))):
        rep = r["report"]
        if (sim := once(open_loop_simulation, r)) is not None:
            sims.append(
                f"| {mode_label(r)} | {r['n']} | {_num(sim['tpot_ms']['p50'], '.2f')} / "
                f"{_num(rep['tpot_ms']['p50'], '.2f')} | {_num(sim['e2e_ms']['p50'] / 1e3, '.2f')} / "
                f"{_num(rep['e2e_s']['p50'], '.2f')} | {_num(sim['queued_ms']['p50'], '.0f')} / "
                f"{_num(sim['queued_ms']['p99'], '.0f')} | {_num(sim['from_arrival_ms']['p50'] / 1e3, '.2f')} / "
                f"{_num(sim['from_arrival_ms']['p99'] / 1e3, '.2f')} | {sim['backlog']} |"
            )
        good = (
            f"{rep['goodput_req_s']:.2f} ({100 * rep['slo_met_share']:.0f} %)"
            if "goodput_req_s" in rep
            else "-"
        )
        rows.append(
            f"| {mode_label(r)} | {r['n']} | {rep['request_throughput_req_s']:.2f} | {spread(rep, 'ttft_ms', '.1f')} | "
            f"{spread(rep, 'tpot_ms', '.2f')} | {spread(rep, 'e2e_s', '.2f')} | {spread(rep, 'queued_ms', '.0f')} | "
            f"{from_arrival(rep)} | "
            f"{rep.get('max_in_flight', '-')} | {good} | {r['thresholds'] or '-'} |"
        )
    return [
        "| mode | N | requests/s served | TTFT p50 / p99 ms | TPOT p50 / p99 ms | E2E p50 / p99 s | "
        "queued at the cap p50 / p99 ms | from arrival to end p50 / p99 s | most in flight | goodput requests/s (met) "
        "| B |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        *rows,
        "",
        *(
            [
                "Each row simulated as an open loop at its rate and cap, on its own step times, thresholds and hop "
                "delays (three\nseeds of 600 s after 10 s; `tokenrouter simulate --request-rate`); a backlog at the "
                "end says the rate is over\nwhat the row serves, however short the measured run was:\n",
                "| mode | N | TPOT p50 ms simulated / measured | E2E p50 s simulated / measured | queued at the cap "
                "p50 / p99 ms, simulated | from arrival to end p50 / p99 s, simulated | backlog at the end |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
                *sims,
                "",
            ]
            if sims
            else []
        ),
    ]


def trace_table(recs: list[dict]) -> list[str]:
    """The live profiles (`--profile-s`): per row and subserver, its steps' host time by phase, the loop's
    time between steps, and the GPU's busy time and kernels per step (bench/trace_summary.py)."""
    rows = []
    for r in sorted(recs, key=lambda r: (MODES.index(r["mode"]), r["n"], mode_label(r))):
        trace = r.get("trace")
        if isinstance(trace, str):
            rows.append(f"| {mode_label(r)} | {r['n']} | - | {trace} | | | | | | | |")
        for model, x in sorted(trace.items()) if isinstance(trace, dict) else ():
            if not x.get("steps"):
                rows.append(f"| {mode_label(r)} | {r['n']} | {model} | 0 | | | | | | | |")
                continue
            gpu = (
                (_num(x["gpu_busy_ms"], ".3f"), _num(x["kernels_per_step"], ".0f"))
                if x["gpu"]
                else ("-", "-")
            )
            rows.append(
                f"| {mode_label(r)} | {r['n']} | {model} | {x['steps']} | {_num(x['host_ms'], '.3f')} | "
                f"{_num(x['forward_ms'], '.3f')} | {_num(x['route_ms'], '.3f')} | {_num(x['commit_ms'], '.3f')} | "
                f"{_num(x['gap_ms'], '.3f')} / {_num(x['gap_p50_ms'], '.3f')} | {gpu[0]} | {gpu[1]} |"
            )
    if not rows:
        return []
    return [
        "Live profiles (`--profile-s`, a second load under torch.profiler, which slows each step): per subserver\n"
        "(the lockstep process's one trace under its entry model) ms per step of host time, by phase, the decode\n"
        "loop's host time between steps, and the GPU's busy time and kernels per step:\n",
        "| mode | N | model | steps | host ms / step | forward | route | commit | loop gap mean / p50 | GPU busy ms / "
        "step | kernels / step |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
    ]


def mode_label(rec: dict) -> str:
    """The mode, with the thresholds of a run served at fixed ones (`--thresholds`)."""
    if rec.get("fixed_thresholds"):
        return f"{rec['mode']} B={threshold_label(rec['thresholds'])}"
    return rec["mode"]


def threshold_table(recs: list[dict], once=lambda model, rec: model(rec)) -> list[str]:
    """TokenRouter at each threshold it was served at (the tuned B and every --thresholds one), per N:
    measured, the DTMC's prediction from the tuning's profile, the DTMC on the run's own step times, the
    simulation of the run as it was with its hops' measured delay (`run_simulation`, hops=True), and the
    ratio to eager at the same N. Empty when no run was served at fixed thresholds. `once(model, rec)`: how the
    checks are computed (`tables` passes its own, which remembers those its summary computed)."""
    if not any(r.get("fixed_thresholds") for r in recs):
        return []
    eager = {r["n"]: r["report"]["decode_throughput_tok_s"] for r in recs if r["mode"] == "eager"}
    rows = []
    trs = [r for r in recs if r["mode"] == "tokenrouter"]
    for r in sorted(trs, key=lambda r: (r["n"], -(r["predicted_tok_s"] or 0.0))):
        tok = r["report"]["decode_throughput_tok_s"]
        pred, own, sim = r["predicted_tok_s"], once(run_prediction, r), once(run_hop_simulation, r)
        gap = once(run_gap_prediction, r)
        rows.append(
            f"| {r['n']} | {threshold_label(r['thresholds'] or {})} | "
            f"{'fixed' if r.get('fixed_thresholds') else 'tuned'} | {tok:.1f} | "
            f"{f'{pred:.1f}' if pred else '-'} | {ratio(tok, pred)} | {f'{own:.1f}' if own else '-'} | "
            f"{ratio(tok, own)} | {f'{gap:.1f}' if gap else '-'} | {ratio(tok, gap)} | "
            f"{f'{sim:.1f}' if sim else '-'} | {ratio(tok, sim)} | {ratio(tok, eager.get(r['n']))} |"
        )
    return [
        "TokenRouter at each threshold served (`--thresholds`; rows by the tuning's prediction, best first); on\n"
        "each row's own step times, the DTMC (without and with the host gaps it measured between back-to-back\n"
        "steps) and the simulation of the run as it was with its hops' measured delay (the DTMC takes hops as\n"
        "instant, and has no batching timeout):\n",
        "| N | B | chosen | tok/s | DTMC predicted | measured / predicted | DTMC on own step times | measured / that "
        "| DTMC, own step times and gaps | measured / that | simulated, own step times and hops | measured / that "
        "| / eager |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
    ]


def step_deltas(rec: dict) -> dict[str, dict[str, float]]:
    """Per model, what its subserver did during the measured run (/metrics after minus before)."""
    before, after = rec.get("metrics_before") or {}, rec.get("metrics_after") or {}
    out: dict[str, dict[str, float]] = {}
    for key, value in after.items():
        found = re.fullmatch(r'tokenrouter_(step_seconds_total|steps_total|step_rows_total|step_tokens_total'
                             r'|step_gaps_total|step_gap_seconds_total|hops_in_total|hop_delay_seconds_total)\{model="([^"]+)"\}', key)  # fmt: skip
        if found:
            name, model = found.groups()
            out.setdefault(model, {})[name] = value - before.get(key, 0.0)
        stall = re.fullmatch(r'tokenrouter_slow_steps_by_batch_total\{model="([^"]+)",bs="\d+"\}', key)
        if stall:  # steps the subserver counted as stalls (servers with the counter)
            d = out.setdefault(stall.group(1), {})
            d["stalls"] = d.get("stalls", 0.0) + value - before.get(key, 0.0)
        start = re.fullmatch(r'tokenrouter_step_starts_total\{model="([^"]+)",reason="(\w+)"\}', key)
        if start:  # why the steps started (servers with the counter)
            out.setdefault(start.group(1), {})[f"starts_{start.group(2)}"] = value - before.get(key, 0.0)
        # steps no co-runner step overlapped (servers with the busy board's counters)
        lone = re.fullmatch(r'tokenrouter_alone_steps_by_batch_total\{model="([^"]+)",bs="\d+"\}', key)
        if lone:
            d = out.setdefault(lone.group(1), {})
            d["alone"] = d.get("alone", 0.0) + value - before.get(key, 0.0)
    return out


# `--report --keep-prefills`: the report's profiles leave the prompt prefills
# in their batch sizes' latencies, as an earlier version did, instead of pricing them apart
KEEP_PREFILLS = False


def prefill_above() -> int | None:
    """`profile_from_metrics`'s `prefill_above` for the report's profiles: its default, or None (`KEEP_PREFILLS`)."""
    from tokenrouter.throughput.from_metrics import PREFILL_ABOVE

    return None if KEEP_PREFILLS else PREFILL_ABOVE


def record_profile(rec: dict, min_steps: int = 5, fit_alone: bool = False):
    """The profile `tokenrouter profile --from-metrics` would build from a TokenRouter / eager run's two
    scrapes (each model's mean step time by batch size, p_ij = hops i→j / decisions of i, with the plan's
    dropping hops among the decisions), or None (another mode, one model, too few steps). Records of servers
    with the uptime and threshold gauges keep them, so the profile carries the busy share and
    the thresholds that `profile --colocation` needs of its second profile. `fit_alone`: its latencies alone
    fitted non-decreasing as `profile` fits them; by default the row's own means, as measured. Its prompt
    prefills are priced apart as `profile` prices them (unless `KEEP_PREFILLS`)."""
    from tokenrouter.throughput.from_metrics import MetricsProfileError, profile_from_metrics

    if rec["mode"] not in ("tokenrouter", "eager", "no-graphs"):
        return None
    before, after = rec.get("metrics_before") or {}, rec.get("metrics_after") or {}
    models = sorted(
        {found.group(1) for k in after if (found := re.search(r'model="([^"]+)"', k))},
        key=lambda x: (x != ENTRY, x),
    )  # fmt: skip
    if len(models) < 2:
        return None

    def text(metrics: dict) -> str:
        return "\n".join(f"{k} {v!r}" for k, v in metrics.items())

    stub = {"models": {x: {} for x in models}, "policy": {"name": rec["policy"]}}
    committed = {x: (rec.get("committed") or {}).get(x, {}) for x in models}
    try:
        # fit_alone False (the default here): the row's own step times as measured
        prof = profile_from_metrics(stub, text(after), text(before), min_steps, committed=committed,
                                    fit_alone=fit_alone, prefill_above=prefill_above())  # fmt: skip
    except MetricsProfileError:
        return None
    return prof if set(prof.routing) == set(models) else None


def write_record_profile(record: Path, out: Path) -> int:
    """`--record-profile`: the record's profile to `out`; 2 with a message where there is none."""
    from tokenrouter.throughput.profile_format import write_profile

    try:
        rec = json.loads(record.read_text())
    except (OSError, ValueError) as e:
        print(f"error: {record}: {e}", file=sys.stderr)
        return 2
    prof = record_profile(rec) if isinstance(rec, dict) and "mode" in rec else None
    if prof is None:
        print(f"error: {record}: no profile in this record (a tokenrouter or eager run whose scrapes saw "
              "every model step at least 5 times at some batch size)", file=sys.stderr)  # fmt: skip
        return 2
    missing = [k for k in ("busy_share", "thresholds") if k not in prof.workload]
    if missing:
        print(f"warning: {record}: the record has no {' or '.join(missing)} (servers or records older than "
              "these gauges): `profile --colocation` needs both of its second profile", file=sys.stderr)  # fmt: skip
    write_profile(prof, out)
    print(f"wrote {out}")
    return 0


def run_system(rec: dict, min_steps: int = 5):
    """The throughput model's inputs from what this run measured (`record_profile`), or None, as
    (SystemInputs, the run's thresholds B)."""
    from tokenrouter.throughput.inputs import make_inputs
    from tokenrouter.throughput.plan_inputs import by_state, with_prefill

    prof = record_profile(rec, min_steps)
    if prof is None:
        return None
    models = sorted(prof.routing, key=lambda x: (x != ENTRY, x))
    committed = {x: (rec.get("committed") or {}).get(x, {}) for x in models}
    p = [[prof.routing[i].get(j, 0.0) for j in models] for i in models]
    c = [[1.0 if i == j else committed[i].get(j, 1.0) for j in models] for i in models]
    thresholds = rec.get("thresholds") or {}
    b = tuple(int(thresholds.get(x, 1)) for x in models)
    inputs = make_inputs(models, prof.step_ms, p, c, rec["n"], entry=models[0])
    # servers with a busy board: each step's latency by state, as `tune` takes it; the records do not keep the
    # placement, so the models with latencies alone are taken to share one GPU (as the pairs do)
    shared = [x for x in models if x in prof.alone_ms]
    groups = {x: [y for y in shared if y != x] for x in shared} if len(shared) > 1 else {}
    return with_prefill(by_state(inputs, prof, groups), prof, list(prof.prefill)), b


def held_rule_served(rec: dict) -> bool:
    """Whether the run's servers had the rule that a model steps when every request it holds is queued (such servers
    count the steps it started)."""
    return any("starts_held" in d for d in step_deltas(rec).values())


def run_prediction(rec: dict, min_steps: int = 5) -> float | None:
    """The DTMC's throughput for this run's thresholds (eager: all 1) on `run_system`'s inputs. This checks
    the queueing model on the latencies the models really had next to each other (the tuning's prediction
    may use latencies profiled one model at a time)."""
    from tokenrouter.throughput.dtmc import analyze

    system = run_system(rec, min_steps)
    return None if system is None else analyze(*system).throughput


def run_gap_prediction(rec: dict, min_steps: int = 5) -> float | None:
    """`run_prediction` with each model's steps lengthened by the host gap the run measured between its
    back-to-back steps (`run_gap_ms`), as `tune --gap-ms` gives the chain; None for records before the counters."""
    from tokenrouter.throughput.dtmc import analyze
    from tokenrouter.throughput.inputs import with_step_ms

    system = run_system(rec, min_steps)
    gaps = None if system is None else run_gap_ms(rec, system[0].models)
    return None if gaps is None else analyze(with_step_ms(system[0], gaps), system[1]).throughput


def run_simulation(
    rec: dict,
    seeds: int = 3,
    min_steps: int = 5,
    hops: bool = False,
    at: dict[str, int] | None = None,
    held_away_ms: float | None = None,
    held_expect: float | None = None,
    gaps: bool = False,
) -> float | None:
    """The simulator on `run_system`'s inputs, but as the run was: its 2N (rounds × N) requests in order, N
    at a time, each with its own routing (`throughput.workload.request_routing`), `output_len` tokens
    each, the stdlib's 5 ms max delay, until the last one ends (tail included); the mean over `seeds`
    seeds. Where requests are not alike (a served r2r run at N = 16: one request of 48 had 506 of its 512 tokens
    on the 8B)
    this is what the DTMC, which assumes N alike requests in flight forever, cannot see. `hops`: each hop also
    takes the mean delay the run measured into its target (`run_hop_ms`; None for records without it), which
    the DTMC takes as instant. `at`: the same run at these thresholds (models left out: 1) instead of its own.
    `held_away_ms`, `held_expect`: the held rule's what-if refinements (`SimConfig`; None for a run whose
    servers had no held rule). `gaps`: each step also takes its model's measured host gap (`run_gap_ms`; None for
    records without it)."""
    from tokenrouter.throughput.simulate import SimConfig, simulate
    from tokenrouter.throughput.workload import WorkloadError, request_routing, with_visit_costs

    system = run_system(rec, min_steps)
    per_request = (rec.get("report") or {}).get("per_request")
    if system is None or not per_request:  # the oldest records have no per_request
        return None
    inputs, b = system
    if at is not None:
        b = tuple(int(at.get(x, 1)) for x in inputs.models)
    hop_ms = run_hop_ms(rec, inputs.models) if hops else None
    gap_ms = run_gap_ms(rec, inputs.models) if gaps else None
    if (hops and hop_ms is None) or (gaps and gap_ms is None):
        return None
    try:
        routing = request_routing(inputs, per_request)
    except WorkloadError:
        return None
    # older records keep no count of the requests a model reached
    inputs = with_visit_costs(inputs, per_request)
    # horizon: a cap far past any run here (the run's last request ends the simulation); the rule that a model
    # steps when every request it holds is queued only where the run's servers had it (they count its starts)
    held = held_rule_served(rec)
    if (held_away_ms is not None or held_expect is not None) and not held:
        return None
    cfg = dict(request_tokens=rec["output_len"], requests=tuple(routing), held_rule=held,
               max_delay_ms=rec.get("max_delay_ms", STDLIB_MAX_DELAY_MS), horizon_ms=3_600_000.0, hop_ms=hop_ms,
               held_away_ms=held_away_ms, held_expect=held_expect, gap_ms=gap_ms)  # fmt: skip
    runs = [simulate(inputs, SimConfig(b, seed=k, **cfg)).throughput for k in range(seeds)]
    return sum(runs) / len(runs)


def whatif_table(
    recs: list[dict],
    candidates: list[dict[str, int]],
    away: tuple[float, ...] = (),
    expect: tuple[float, ...] = (),
) -> list[str]:
    """`--report --simulate-at B ... --simulate-held-away MS ...`: each TokenRouter and eager row simulated as it
    was (its step times, its requests each with its own routing, its hops' measured delay, the batching rules its
    servers had) at its own thresholds and at each of `candidates`: what the thresholds change on one row's
    routing, where two rows of an untrained router differ in routing too (as two r2r rows at N = 4 on the
    H200 did); and at its own thresholds with each `away` (ms) as `SimConfig.held_away_ms` and each `expect` as
    `SimConfig.held_expect`, where its servers had the held rule."""
    names = [f"at {threshold_label(c)}" for c in candidates] + [f"held away < {a:g} ms" for a in away]
    names += [f"held expect < {e:g}" for e in expect]
    rows = []
    for r in sorted(recs, key=lambda r: (MODES.index(r["mode"]), r["n"], mode_label(r))):
        if r["mode"] not in ("tokenrouter", "eager"):
            continue
        own = run_simulation(r, seeds=5, hops=True)
        if own is None:
            continue
        sims = [run_simulation(r, seeds=5, hops=True, at=c) for c in candidates]
        sims += [run_simulation(r, seeds=5, hops=True, held_away_ms=a) for a in away]
        sims += [run_simulation(r, seeds=5, hops=True, held_expect=e) for e in expect]
        measured = r["report"]["decode_throughput_tok_s"]
        cells = " | ".join(f"{x:.1f} ({x / own:.3f}x)" if x is not None else "-" for x in sims)
        rows.append(f"| {mode_label(r)} | {r['n']} | {measured:.1f} | {own:.1f} | {cells} |")
    if not rows:
        return []
    return [
        "Each row simulated as it was (its step times and requests, each with its own routing, its hops' measured "
        "delay; five seeds) at its own thresholds and at others (and / its own):\n",
        "| mode | N | tok/s | simulated | " + " | ".join(names) + " |",
        "| --- | ---: | ---: | ---: |" + " ---: |" * len(names),
        *rows,
        "",
    ]


def run_hop_simulation(rec: dict) -> float | None:
    """`run_simulation` with each hop taking the run's measured delay into its target."""
    return run_simulation(rec, hops=True)


def run_gap_simulation(rec: dict) -> float | None:
    """`run_hop_simulation` with each step also taking its model's measured host gap."""
    return run_simulation(rec, hops=True, gaps=True)


def one_model_system(rec: dict, min_steps: int = 5):
    """An llm-only run's one model as the simulator's system (`run_system` has none for it): its step latency by
    batch size from the run's own scrapes (each batch size seen `min_steps` times or more), routing nowhere
    else; None where no batch size was."""
    from tokenrouter.throughput.inputs import StepLatency, make_inputs

    before, after = rec.get("metrics_before") or {}, rec.get("metrics_after") or {}
    cells: dict[str, dict[int, dict[str, float]]] = {}  # model -> batch size -> counter -> the run's delta
    for key, value in after.items():
        if hit := BY_BATCH.fullmatch(key):
            name, model, bs = hit.groups()
            cells.setdefault(model, {}).setdefault(int(bs), {})[name] = value - before.get(key, 0.0)
    if len(cells) != 1:
        return None
    ((model, by_bs),) = cells.items()
    sums = {bs: (d.get("steps", 0.0), d.get("step_seconds", 0.0)) for bs, d in by_bs.items()}
    points = tuple((bs, 1000.0 * sec / n) for bs, (n, sec) in sorted(sums.items()) if n >= min_steps)
    if not points:
        return None
    return make_inputs([model], {model: StepLatency(points)}, [[1.0]], [[1.0]], rec["n"]), (1,)


def open_loop_simulation(rec: dict, rate: float | None = None, seeds: int = 3, horizon_ms: float = 600_000.0,
                         own_arrivals: bool = False, gaps: bool = False):  # fmt: skip
    """An open loop's row simulated at its offered rate (or `rate`) and cap on its own step times, thresholds,
    hop delays and max delay (`SimConfig.arrival_rate_per_s`; llm-only: `one_model_system`): each latency's p50
    and p99 as the mean over `seeds` runs of `horizon_ms` after a 10 s warm-up, and the largest backlog at the
    cap at the end; None without the inputs. `own_arrivals`: on the row's own arrival times instead, every
    request measured, to the last one's end (`workload.report_arrivals`; the seeds then vary the routing only).
    `gaps`: each step also takes its model's measured host gap (`run_gap_ms`, `SimConfig.gap_ms`)."""
    from tokenrouter.throughput.simulate import SimConfig, simulate
    from tokenrouter.throughput.workload import report_arrivals

    system = one_model_system(rec) if rec["mode"] == "llm-only" else run_system(rec)
    if system is None:
        return None
    inputs, b = system
    hop_ms = run_hop_ms(rec, inputs.models) if len(inputs.models) > 1 else None
    held = held_rule_served(rec)
    if own_arrivals:
        times = report_arrivals(rec["report"], f"{rec['mode']} N={rec['n']}")[0]
        load = {"arrivals_ms": times, "horizon_ms": times[-1] + horizon_ms, "warmup_ms": 0.0}
    else:
        load = {
            "arrival_rate_per_s": rate or rec["request_rate"],
            "horizon_ms": horizon_ms,
            "warmup_ms": 10_000.0,
        }
    if gaps:
        load["gap_ms"] = run_gap_ms(rec, inputs.models)
    runs = [
        simulate(inputs, SimConfig(b, seed=k, request_tokens=rec["output_len"],
                                   max_delay_ms=rec.get("max_delay_ms", STDLIB_MAX_DELAY_MS), hop_ms=hop_ms,
                                   held_rule=held, **load)).latency
        for k in range(seeds)
    ]  # fmt: skip
    out = {
        key: {q: sum(r[key][q] for r in runs) / seeds for q in ("p50", "p99")}
        for key in ("ttft_ms", "tpot_ms", "e2e_ms", "queued_ms", "from_arrival_ms")
    }
    return out | {"backlog": max(r["backlog"] for r in runs)}


def run_gap_ms(rec: dict, models: tuple[str, ...]) -> tuple[float, ...] | None:
    """Per model, the mean host time between its back-to-back steps during the run
    (`tokenrouter_step_gap_seconds_total` over `tokenrouter_step_gaps_total`, 0 where none), or None for records
    before the counters."""
    return run_means(rec, models, "step_gaps_total", "step_gap_seconds_total")


def run_hop_ms(rec: dict, models: tuple[str, ...]) -> tuple[float, ...] | None:
    """Per model, the mean delay of the hops it received during the run (`tokenrouter_hop_delay_seconds_total`
    over `tokenrouter_hops_in_total`, 0 where none came), or None for records before the counters."""
    return run_means(rec, models, "hops_in_total", "hop_delay_seconds_total")


def run_means(rec: dict, models: tuple[str, ...], count: str, seconds: str) -> tuple[float, ...] | None:
    """Per model, ms per event over the run (`mean_ms` of its `step_deltas`; 0 where it had none), or None where no
    model counted `count` (records of servers before the counter)."""
    deltas = step_deltas(rec)
    if not any(d.get(count) for d in deltas.values()):
        return None
    return tuple(mean_ms(deltas.get(x, {}), count, seconds) or 0.0 for x in models)


def mean_ms(d: dict[str, float], count: str, seconds: str) -> float | None:
    """ms per event from a model's `step_deltas`: the `seconds` counter over the `count` one (None without
    events, or on servers without the counters)."""
    n = d.get(count, 0.0)
    return 1000.0 * d[seconds] / n if n else None


def time_table(recs: list[dict]) -> list[str]:
    """Where the time goes: each model's busy share of the run's wall time, ms per step, rows and tokens
    per step (tokens > rows: prefills and extends of returning requests)."""
    from tokenrouter.runtime.subserver.batching import START_REASONS

    rows = []
    for r in sorted(recs, key=lambda r: (MODES.index(r["mode"]), r["n"])):
        wall = r["report"].get("wall_s") or 0.0
        for model, d in sorted(step_deltas(r).items()):
            steps = d.get("steps_total", 0.0)
            if not steps or "step_seconds_total" not in d or not wall:
                continue
            busy = d["step_seconds_total"]
            stalls = f"{d['stalls']:.0f}" if "stalls" in d else "-"  # no counter in older servers
            starts = (  # no counter in older servers
                " / ".join(f"{d[f'starts_{x}']:.0f}" if f"starts_{x}" in d else "-" for x in START_REASONS)
                if any(k.startswith("starts_") for k in d)
                else "-"
            )
            alone = f"{d['alone']:.0f}" if "alone" in d else "-"  # no busy board, or a server before it
            # gaps and hop delays: "-" from older servers
            gap, hop = (mean_ms(d, "step_gaps_total", "step_gap_seconds_total"),
                        mean_ms(d, "hops_in_total", "hop_delay_seconds_total"))  # fmt: skip
            gap, hop = (f"{x:.2f}" if x is not None else "-" for x in (gap, hop))
            rows.append(
                f"| {mode_label(r)} | {r['n']} | {model} | {steps:.0f} | {busy:.2f} | {busy / wall:.0%} | "
                f"{1000 * busy / steps:.2f} | {d.get('step_rows_total', 0) / steps:.2f} | "
                f"{d.get('step_tokens_total', 0) / steps:.2f} | {stalls} | {starts} | {alone} | {gap} | {hop} |"
            )
    if not rows:
        return []
    return [
        "Where the time goes (measured run only): steps, seconds in steps (forward + route kernel), busy share",
        "of the run's wall time, ms per step, rows and tokens run per step (std-serving's servers before d7a5259",
        "also counted the tokens its prefix cache held, `tokenrouter_prefix_matched_tokens`), and the steps the",
        "subserver counted as stalls (over 50 ms and 10x their batch size's mean step per new token; included in",
        "the rest), and why",
        "the steps started: their threshold B_i reached / B_i lowered while few requests were active / every",
        "request the model holds runnable (- from older servers) / the max_delay_ms timeout",
        "(`tokenrouter_step_starts_total`); the steps that no step of a model sharing the GPU overlapped",
        "(`tokenrouter_alone_steps_by_batch_total`), and the host ms between back-to-back steps",
        "(from a step's end, with the next one ready, to that one's start: `tokenrouter_step_gap_seconds_total`),",
        "and the ms of delay per hop into the model (from the end of the sender's step, or of the receiver's step",
        "it arrived during, to the receiver taking it in: `tokenrouter_hop_delay_seconds_total`).\n",
        "| mode | N | model | steps | busy s | busy | ms / step | rows / step | tokens / step | stalls | starts "
        "| alone | gap ms | hop ms |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
    ]


BY_BATCH = re.compile(r'tokenrouter_((?:alone_)?(?:steps|step_seconds|step_tokens))_by_batch_total'
                      r'\{model="([^"]+)",bs="(\d+)"\}')  # fmt: skip


def counter_deltas(recs: list[dict], pattern: re.Pattern):
    """For `batch_table` and `shape_table`: each TokenRouter / eager row and served profile of `recs` (the profiles
    first, then by mode and N), with the groups of every series of its later scrape that `pattern` matches and the
    series' difference between the two scrapes."""
    order = lambda r: (-1 if r["mode"] == "profile" else MODES.index(r["mode"]), r["n"])  # noqa: E731
    for r in sorted(recs, key=order):
        if r["mode"] not in ("tokenrouter", "eager", "profile"):
            continue
        before, after = r.get("metrics_before") or {}, r.get("metrics_after") or {}
        yield (
            r,
            [
                (hit.groups(), v - before.get(k, 0.0))
                for k, v in after.items()
                if (hit := pattern.fullmatch(k))
            ],
        )


def batch_table(recs: list[dict]) -> list[str]:
    """`--report --by-batch`: per TokenRouter / eager row, model and batch size, the steps, ms and tokens per
    step, all and alone (no step of a model sharing the GPU overlapped), from the `*_by_batch_total` counters.
    The profile's latency L_i(b) is the mean of steps that may carry different tokens: a prefill or a returning
    hop's extend makes a step of b rows longer. Tokens by batch size: '-' from servers that did not count
    them."""
    rows = []
    for r, found in counter_deltas(recs, BY_BATCH):
        cells: dict[tuple[str, int], dict[str, float]] = {}
        for (name, model, bs), delta in found:
            cells.setdefault((model, int(bs)), {})[name] = delta
        for (model, bs), d in sorted(cells.items()):
            if not d.get("steps"):
                continue
            per_step = [  # ms and tokens per step, all steps and then the alone ones
                f"{scale * d[what] / d[steps]:.2f}" if d.get(steps) and what in d else "-"
                for steps, what, scale in (("steps", "step_seconds", 1000.0), ("steps", "step_tokens", 1.0),
                                           ("alone_steps", "alone_step_seconds", 1000.0),
                                           ("alone_steps", "alone_step_tokens", 1.0))
            ]  # fmt: skip
            rows.append(
                f"| {r.get('label') or mode_label(r)} | {r['n']} | {model} | {bs} | {d['steps']:.0f} | {per_step[0]} | {per_step[1]} | "
                f"{d.get('alone_steps', 0.0):.0f} | {per_step[2]} | {per_step[3]} |"
            )
    if not rows:
        return []
    return [
        "By batch size: steps, ms and tokens per step, and the same for the steps no step of a model sharing the",
        "GPU overlapped (`tokenrouter_*_by_batch_total`; tokens '-' from older servers); the served",
        "profiles first (`profile eager`, and a second one served at fixed thresholds), then the measured rows.\n",
        "| mode | N | model | bs | steps | ms / step | tokens / step | alone | alone ms / step | alone tokens / step |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
    ]


BY_SHAPE = re.compile(r'tokenrouter_(steps|step_seconds|step_tokens)_by_shape_total'
                      r'\{model="([^"]+)",bs="(\d+)",q="(\d+)",overlap="([a-z]+)"\}')  # fmt: skip


def shape_table(recs: list[dict]) -> list[str]:
    """`--report --by-shape`: per TokenRouter / eager row and model, the steps of each shape (batch size, the
    longest row's new tokens rounded up to a power of two, and how they overlapped a step of a model sharing the
    GPU), with ms and tokens per step, from the `*_by_shape_total` counters (servers that have them).
    A batch size's mean step (`--by-batch`) mixes these: a CUDA graph of (bs, q) pads every row to q tokens."""
    rows = []
    for r, found in counter_deltas(recs, BY_SHAPE):
        cells: dict[tuple[str, int, int, str], dict[str, float]] = {}
        for (name, model, bs, q, overlap), delta in found:
            cells.setdefault((model, int(bs), int(q), overlap), {})[name] = delta
        for (model, bs, q, overlap), d in sorted(cells.items()):
            if not (n := d.get("steps")):
                continue
            rows.append(
                f"| {r.get('label') or mode_label(r)} | {r['n']} | {model} | {bs} | {q} | {overlap} | {n:.0f} | "
                f"{1000.0 * d.get('step_seconds', 0.0) / n:.2f} | {d.get('step_tokens', 0.0) / n:.2f} |"
            )
    if not rows:
        return []
    return [
        "By step shape: batch size, the longest row's new tokens rounded up to a power of two (q = 1: a decode "
        "step), and",
        "how the step overlapped a step of a model sharing the GPU (`tokenrouter_*_by_shape_total`); the served "
        "profiles first.\n",
        "| mode | N | model | bs | q | overlap | steps | ms / step | tokens / step |",
        "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |",
        *rows,
        "",
    ]


def chart(records: list[dict], path: Path) -> None:
    from tokenrouter.plotting import figure

    records = [r for r in records if not r.get("fixed_thresholds")]  # the tuned runs: one bar per mode and N
    groups = sorted({(r["pair"], r["policy"]) for r in records})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with figure(path, (5 * len(groups), 4), dpi=120, ncols=len(groups), squeeze=False) as (_, axes):
        _chart_groups(axes[0], records, groups)


def _chart_groups(axes, records: list[dict], groups: list[tuple]) -> None:
    for ax, (pair, policy) in zip(axes, groups, strict=True):
        recs = [r for r in records if (r["pair"], r["policy"]) == (pair, policy)]
        ns = sorted({r["n"] for r in recs})
        modes = [m for m in MODES if any(r["mode"] == m for r in recs)]
        width = 0.8 / len(modes)
        for i, m in enumerate(modes):
            tok = {r["n"]: r["report"]["decode_throughput_tok_s"] for r in recs if r["mode"] == m}
            xs = [k + i * width for k, n in enumerate(ns) if n in tok]
            ax.bar(xs, [tok[n] for n in ns if n in tok], width, label=m)
        pred = {
            r["n"]: r["predicted_tok_s"] for r in recs if r["mode"] == "tokenrouter" and r["predicted_tok_s"]
        }
        if pred:
            ax.scatter(
                [ns.index(n) for n in pred], list(pred.values()), marker="_", s=400, c="k", label="DTMC (TR)"
            )
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(ns))], [f"N={n}" for n in ns])
        ax.set_title(f"{pair}, {policy}")
        ax.set_ylabel("decode tok/s")
    for ax in axes:
        ax.legend(fontsize=7)


PROFILE_SCRAPE = re.compile(r"profile-metrics-n(\d+)(?:-(.+))?-after\.txt")


def profile_records(paths: list[str]) -> list[dict]:
    """The served profiles of each archive or folder in `paths` as records for `batch_table`: their two /metrics
    scrapes (`profile-metrics-nN[-TAG]-before.txt` / `-after.txt`), labelled `profile eager` or `profile TAG`."""
    out = []
    for p in map(Path, paths):
        found = dict(part_files(p, "profile-metrics-*.txt"))  # one archive's: each has its own -n8-after.txt
        for name, after in sorted(found.items()):
            if not (m := PROFILE_SCRAPE.fullmatch(name)):
                continue
            before = found.get(name.replace("-after.txt", "-before.txt"), b"")
            out.append({"mode": "profile", "label": f"profile {m.group(2) or 'eager'}", "n": int(m.group(1)),
                        "metrics_before": prom_values(before.decode()),
                        "metrics_after": prom_values(after.decode())})  # fmt: skip
    return out


def part_files(p: Path, pattern: str) -> list[tuple[str, bytes]]:
    """(name, bytes) of the files named like `pattern` (fnmatch) in a part's folder (searched down) or results
    archive (.tar.gz), in their order there; [] for anything else."""
    if p.is_dir():
        return [(f.name, f.read_bytes()) for f in sorted(p.rglob(pattern))]
    if p.suffixes[-2:] == [".tar", ".gz"]:
        with tarfile.open(p) as tar:
            return [(Path(m.name).name, tar.extractfile(m).read()) for m in tar.getmembers()
                    if m.isfile() and fnmatch.fnmatch(Path(m.name).name, pattern)]  # fmt: skip
    return []


def load_records(paths: list[str]) -> list[dict]:
    records = []
    for p in map(Path, paths):
        if p.is_dir() or p.suffixes[-2:] == [".tar", ".gz"]:
            records += [json.loads(data) for _, data in part_files(p, "record-*.json")]
        else:
            records.append(json.loads(p.read_text()))
    return records


def finish(s: Settings, name: str, records: list[dict], failures: list[str], quiet: bool = False) -> None:
    s.out.mkdir(parents=True, exist_ok=True)
    text = tables(records)
    if failures:
        text += "\n**Failed:**\n" + "\n".join(f"- {f}" for f in failures) + "\n"
    (s.out / f"summary-{name}.md").write_text(text)
    (s.out / f"summary-{name}.json").write_text(
        json.dumps({"records": records, "failures": failures}, indent=1)
    )
    if records:
        try:
            chart(records, s.out / f"chart-{name}.png")
        except ImportError:  # the GPU machine has no matplotlib: draw it here with --report --chart
            if not quiet:
                say(
                    s,
                    "no matplotlib: chart skipped (bench/matrix.py --report results-*.tar.gz --chart X.png)",
                )
    (s.out / f"matrix-{name}.log").write_text("\n".join(s.log) + "\n")
    with tarfile.open(s.out / f"results-{name}.tar.gz", "w:gz") as tar:
        for raw in sorted(s.work.glob("raw-*")):
            tar.add(raw, arcname=raw.name)
    if not quiet:
        print(text)


# ---- entry ------------------------------------------------------------------------------------------------


def parse_runs(values: list[str]) -> dict[str, tuple[int, ...]]:
    """`--run` values -> {mode: its Ns}; a mode given twice runs every N given (`--run m:4 --run m:8` is
    `--run m:4,8`; the second used to replace the first, silently)."""
    runs: dict[str, tuple[int, ...]] = {}
    for v in values:
        mode, _, ns = v.partition(":")
        if mode not in MODES or not ns:
            raise ValueError(f"--run {v!r}: expected MODE:N[,N...] with MODE one of {', '.join(MODES)}")
        new = tuple(int(n) for n in ns.split(","))
        runs[mode] = tuple(dict.fromkeys((*runs.get(mode, ()), *new)))
    return runs


def parse_thresholds(value: str, flag: str = "--thresholds") -> dict[str, int]:
    """`slm=1,llm=4` -> {"slm": 1, "llm": 4}."""
    out = {}
    for item in value.split(","):
        model, eq, b = item.partition("=")
        if not (eq and model.strip() and b.strip().isdigit() and int(b) >= 1):
            raise ValueError(f"{flag} {value!r}: expected MODEL=B[,MODEL=B...] with B >= 1")
        out[model.strip()] = int(b)
    return out


def parse_number(value: str, flag: str, unit: str = "milliseconds", positive: bool = False) -> float:
    """A finite number of `unit`, >= 0 (> 0 with `positive`)."""
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and (x > 0 if positive else x >= 0)):
        raise ValueError(f"{flag} {value!r}: expected a number of {unit} {'> 0' if positive else '>= 0'}")
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", action="append", default=[], help="a named part (see --list); repeatable")
    ap.add_argument("--pair", choices=sorted(PAIRS))
    ap.add_argument("--policy", choices=sorted(POLICIES))
    ap.add_argument("--run", action="append", default=[], help="MODE:N[,N...] (with --pair and --policy)")
    ap.add_argument("--cpu-smoke", action="store_true", help="a tiny matrix on the tiny models, on CPU")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--report", nargs="+", metavar="RESULTS", help="tables and a chart from raw results")
    ap.add_argument("--chart", default=None, help="with --report: PNG to write")
    ap.add_argument("--by-batch", action="store_true",
                    help="with --report: steps, ms and tokens per step by batch size, all and alone")  # fmt: skip
    ap.add_argument("--by-shape", action="store_true",
                    help="with --report: steps, ms and tokens per step by batch size, the longest row's new "
                    "tokens and overlap")  # fmt: skip
    ap.add_argument("--simulate-at", action="append", default=[], metavar="MODEL=B,...",
                    help="with --report: each row simulated as it was at these thresholds too; repeatable")  # fmt: skip
    ap.add_argument("--simulate-held-away", action="append", default=[], metavar="MS",
                    help="with --report: each row simulated as it was, with a request away from a model for "
                    "longer than MS no longer held there (a what-if of the held rule, not the runtime's); "
                    "repeatable")  # fmt: skip
    ap.add_argument("--simulate-held-expect", action="append", default=[], metavar="ROWS",
                    help="with --report: each row simulated as it was, stepping once the requests away are "
                    "expected to bring fewer than ROWS back before the timeout, each at its own rate of leaving "
                    "(a what-if of the held rule, not the runtime's); repeatable")  # fmt: skip
    ap.add_argument("--keep-prefills", action="store_true",
                    help="with --report: the checks on each run's own step times leave its prompt prefills in the "
                    "latencies of the batch sizes they ran at (as older reports did) instead "
                    "of pricing them apart")  # fmt: skip
    ap.add_argument("--out", default="out/matrix")
    ap.add_argument("--work", default="/tmp/tr-matrix", help="models, plans, raw files (keep it outside OUT)")
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=32,
                    help="tokens of each synthetic prompt (default 32); std-serving sends and prefix-matches the whole "
                    "context at every hop, so longer prompts weigh on it; a prompt and its output tokens must fit the plans' "
                    f"{MAX_LEN}-token context")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=2, help="requests per run = ROUNDS x N")
    ap.add_argument("--profile-rounds", type=int, default=None,
                    help="requests per N of the served profiles' load = PROFILE_ROUNDS x N (default: --rounds)")  # fmt: skip
    ap.add_argument("--r2r-threshold", default=None, help="-D threshold= for r2r (default: the stdlib's)")
    ap.add_argument("--r-stitch-threshold", default=None, help="-D threshold= for r_stitch")
    ap.add_argument(
        "--route-share",
        type=float,
        default=0.1,
        help="r2r / r_stitch without a threshold: calibrate it so that the large model writes this share of the "
        "tokens, served in-process on the load's first prompts (0: the stdlib's default threshold)",
    )
    ap.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        help="an extra argument for every `serve` (repeatable; e.g. --serve-arg=--mps-sm=llm=70)",
    )
    ap.add_argument("--tag", default="", help="suffix of the part's name (its output files)")
    ap.add_argument("--thresholds", action="append", default=[], metavar="MODEL=B[,MODEL=B]",
                    help="serve TokenRouter again at these fixed delayed-batching thresholds beside the tuned "
                    "ones, with the DTMC's prediction for them (repeatable; models not named keep the tuned B)")  # fmt: skip
    ap.add_argument("--colocation", default=None, metavar="MODEL=B[,MODEL=B]",
                    help="profile the plan served a second time at these thresholds and tune with the "
                    "co-location term fitted from both (`profile --colocation`)")  # fmt: skip
    ap.add_argument("--alone-from", default=None, metavar="MODEL=B[,MODEL=B]",
                    help="profile the plan served a second time at these thresholds and tune with its latencies "
                    "alone (the busy board's) in place of the eager profile's (`profile --alone`)")  # fmt: skip
    ap.add_argument("--served-from", default=None, metavar="MODEL=B[,MODEL=B] | tuned",
                    help="profile the plan served a second time at these thresholds and tune with its latencies "
                    "(every step's, alone and beside) at each batch size it measured, the eager profile's at the "
                    "rest (`profile --merge`); `tuned`: at the thresholds the eager profile chooses, per N (tuning "
                    "in two passes)")  # fmt: skip
    ap.add_argument("--max-delay-ms", type=float, default=STDLIB_MAX_DELAY_MS,
                    help="the plans' `serve { max_delay_ms }`: the longest a request waits for its model's "
                    "batch to reach B_i (default 5, the stdlib's)")  # fmt: skip
    ap.add_argument(
        "--tune-from",
        choices=("profile", "eager"),
        default="eager",
        help="tune's step latencies: served side by side at B = 1 (eager, the default: `profile "
        "--from-metrics`) or each model timed alone (profile: misses the co-running slowdown)",
    )
    ap.add_argument("--record-profile", nargs=2, metavar=("RECORD", "PROFILE"), default=None,
                    help="write the profile of a served run's record (record-*.json) to PROFILE: a second "
                    "profile for `tokenrouter profile --colocation` at that run's thresholds")  # fmt: skip
    ap.add_argument("--request-rate", default=None, metavar="R",
                    help="the measured rows as an open loop: R requests per second (Poisson, seeded), at most N in "
                    "flight (default: a closed loop of N workers); its tables leave out the DTMC's checks")  # fmt: skip
    ap.add_argument("--tune-at-rate", action="store_true",
                    help="with --request-rate: serve the eager profile's load at that rate too, and tune each N for "
                    "the lowest time from arrival p99 at it (`tune --request-rate`) instead of the chain's "
                    "closed-loop throughput")  # fmt: skip
    ap.add_argument("--profile-s", default=None, metavar="S",
                    help="after each measured row, a second load (not measured) under a live profile of S "
                    "seconds: each subserver's steps, phases, loop gaps and GPU busy time (bench/trace_summary.py)")  # fmt: skip
    ap.add_argument("--slo-ttft-ms", default=None, help="with the rows' goodput: a TTFT SLO (`bench`)")
    ap.add_argument("--slo-tpot-ms", default=None, help="with the rows' goodput: a TPOT SLO (`bench`)")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no server whose rows, each as long as the part's longest so far, would end after "
                         "this many seconds of the part (the rest is reported skipped)")  # fmt: skip
    a = ap.parse_args(argv)
    if a.list:
        for name, p in PARTS.items():
            print(
                f"{name:22} ~{p.minutes:.0f} min ({p.timed or 'unmeasured guess'})  {p.pair:13} {p.policy:9} {p.runs}  ({p.note})"
            )
        return 0
    if a.record_profile:
        return write_record_profile(*map(Path, a.record_profile))
    if a.report:
        try:  # checked before anything prints
            at = [parse_thresholds(v, "--simulate-at") for v in a.simulate_at]
            away = tuple(parse_number(v, "--simulate-held-away") for v in a.simulate_held_away)
            expect = tuple(
                parse_number(v, "--simulate-held-expect", "rows", positive=True)
                for v in a.simulate_held_expect
            )
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        global KEEP_PREFILLS
        KEEP_PREFILLS = a.keep_prefills
        records = load_records(a.report)
        print(tables(records))
        if a.by_batch:
            print("\n".join(batch_table(profile_records(a.report) + records)))
        if a.by_shape:
            print("\n".join(shape_table(profile_records(a.report) + records)))
        if at or away or expect:
            print("\n".join(whatif_table(records, at, away, expect)))
        if a.chart:
            chart(records, Path(a.chart))
        return 0
    try:
        unknown = [x for x in a.part if x not in PARTS]
        if unknown:
            raise ValueError(f"unknown part {unknown[0]!r} (python bench/matrix.py --list shows them)")
        thresholds = [parse_thresholds(v) for v in a.thresholds]
        colocation = parse_thresholds(a.colocation, "--colocation") if a.colocation else None
        for flag, v in (
            ("--rounds", a.rounds),
            ("--profile-rounds", a.profile_rounds),
            ("--prompt-len", a.prompt_len),
        ):
            if v is not None and v < 1:
                raise ValueError(f"{flag} must be an int >= 1, got {v}")
        if not (a.max_delay_ms >= 0 and math.isfinite(a.max_delay_ms)):
            raise ValueError(f"--max-delay-ms must be a finite number >= 0, got {a.max_delay_ms}")
        alone_from = parse_thresholds(a.alone_from, "--alone-from") if a.alone_from else None
        rate, slo_ttft, slo_tpot, profile_s = (
            None if value is None else parse_number(value, flag, unit, positive=True)
            for value, flag, unit in ((a.request_rate, "--request-rate", "requests per second"),
                                      (a.slo_ttft_ms, "--slo-ttft-ms", "milliseconds"),
                                      (a.slo_tpot_ms, "--slo-tpot-ms", "milliseconds"),
                                      (a.profile_s, "--profile-s", "seconds"))
        )  # fmt: skip
        if a.tune_at_rate and rate is None:
            raise ValueError("--tune-at-rate needs --request-rate")
        served_from = (a.served_from if a.served_from == TWO_PASS else
                       parse_thresholds(a.served_from, "--served-from") if a.served_from else None)  # fmt: skip
        given = [flag for flag, v in (("--colocation", colocation), ("--alone-from", alone_from),
                                      ("--served-from", served_from)) if v]  # fmt: skip
        if given and a.tune_from != "eager":
            raise ValueError(f"{given[0]} needs --tune-from eager (served profiles)")
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} are ways to correct the eager profile: give one")
        jobs: list[tuple[str, Part]] = [(name, PARTS[name]) for name in a.part]
        if a.run:
            if not (a.pair and a.policy):
                raise ValueError("--run needs --pair and --policy")
            jobs.append(
                (f"{a.pair.replace('+', '_')}-{a.policy}-custom", Part(a.pair, a.policy, parse_runs(a.run)))
            )
        if a.cpu_smoke:
            smoke = {"tokenrouter": (1, 4), "llm-only": (4,), "lockstep": (4,), "std-serving": (4,),
                     "eager": (4,), "no-graphs": (4,)}  # fmt: skip
            jobs += [("smoke-bern0.35", Part("tiny", "bern0.35", smoke)),
                     ("smoke-r2r", Part("tiny", "r2r", {"tokenrouter": (4,), "lockstep": (4,)}))]  # fmt: skip
        if not jobs:
            raise ValueError("nothing to run: give --part, --run or --cpu-smoke (or --list, --report)")
        for name, part in jobs:
            out_len = part_output_len(part, a.output_len)
            if a.prompt_len + out_len > MAX_LEN:
                raise ValueError(
                    f"part {name}: --prompt-len {a.prompt_len} and {out_len} output tokens need "
                    f"{a.prompt_len + out_len} tokens of context, over the {MAX_LEN} the matrix's plans give "
                    f"each model (--prompt-len {MAX_LEN - out_len} at most)"
                )
    except (KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    failed = False
    for name, part in jobs:
        name += f"-{a.tag}" if a.tag else ""
        s = Settings(out=out, work=Path(a.work) / name, device=None, serve_args=list(a.serve_arg),
                     tune_from=a.tune_from,
                     output_len=a.output_len, prompt_len=a.prompt_len, rounds=a.rounds,
                     profile_rounds=a.profile_rounds,
                     r2r_threshold=a.r2r_threshold,
                     r_stitch_threshold=a.r_stitch_threshold, route_share=a.route_share or None,
                     deadline_s=a.deadline_s, thresholds=thresholds, colocation=colocation, alone_from=alone_from,
                     served_from=served_from, request_rate=rate, tune_at_rate=a.tune_at_rate, slo_ttft_ms=slo_ttft, slo_tpot_ms=slo_tpot,
                     profile_s=profile_s,
                     max_delay_ms=a.max_delay_ms)  # fmt: skip
        s.output_len = part_output_len(part, a.output_len)
        if part.rounds is not None:
            s.rounds = part.rounds
        if part.pair == "tiny":
            s.device, s.batch_sizes, s.warmup_len, s.profile_min_steps = "cpu", "1,2,4", 4, 5
            s.profile_after_s = 0.0  # its loads last about a second
        try:
            records, failures = run_part(s, name, part)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
            records, failures = [], [f"part {name}: {e}"]
            say(s, f"FAILED part {name}: {e}")
        finish(s, name, records, failures)
        failed |= bool(failures)
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        sys.exit(main())
    finally:
        stop_live()
