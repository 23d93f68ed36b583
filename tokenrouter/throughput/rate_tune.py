"""Thresholds for latency at an offered load: `tokenrouter tune --request-rate R`.

The chain (`optimize.tune`) chooses B for a closed loop's throughput: N requests always in flight. Below
saturation that need not be the B with the lowest latency; on the H200 the chain's (2, 5) served TPOT p50
8-16 % and the time from arrival p99 15-20 % above (1, 2) at 4 requests/s.
Here each candidate is an open loop in the simulator (`SimConfig.arrivals_ms`: requests arrive at R per
second, at most N in flight, each commits `request_tokens`, with the plan's batching timeout) and is ranked by
one latency of its requests (`OBJECTIVES`).

Simulating every candidate long enough to rank it is slow (136 candidates at N = 16), so the search has two
rounds:

1. every feasible candidate once (seed 0) over `screen_ms`;
2. the best `keep` of them again over `horizon_ms` with each of `seeds` seeds, ranked on the mean.

Every candidate of a seed sees the same arrivals (common random numbers: arrival bursts, which dominate the
latencies, are then not what tells two candidates apart). A candidate that falls behind the rate (more than
2N requests waiting at the cap at the end of a run) ranks after every one that keeps up; one that runs more
than 5 % of a model's steps with more rows than that model's step latency was measured at (`measured_sizes`)
ranks after those priced within the measurements: steps of those sizes are priced as the largest measured,
which makes them look cheaper than they are.
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

from tokenrouter.throughput.inputs import SystemInputs
from tokenrouter.throughput.optimize import TuneError, candidates, count_feasible, fixed_indices
from tokenrouter.throughput.sim_config import SimConfig, steps_error
from tokenrouter.throughput.simulate import simulate

# the objective's name -> (the latency, the statistic) of `SimResult.latency`
OBJECTIVES = {
    f"{name}-{q}": (key, q)
    for name, key in (
        ("from-arrival", "from_arrival_ms"),
        ("tpot", "tpot_ms"),
        ("ttft", "ttft_ms"),
        ("e2e", "e2e_ms"),
    )  # fmt: skip
    for q in ("p50", "p99", "mean")
}
SHOWN = ("ttft_ms", "tpot_ms", "from_arrival_ms")  # the latencies a candidate keeps (p50, p99 and mean)
# a candidate more of whose steps of one model than this share have more rows than the model's step latency was
# measured at ranks after those priced within the measurements
BEYOND_SHARE = 0.05


@dataclass(slots=True)
class RateSettings:
    rate_per_s: float  # requests per second (Poisson)
    request_tokens: int
    objective: str = "from-arrival-p99"
    max_delay_ms: float | None = None  # the batching timeout (the plan's `serve.max_delay_ms`)
    hop_ms: tuple[float, ...] | None = None  # per model, a hop's transit into it
    gap_ms: tuple[float, ...] | None = None  # per model, host time per step beyond its latency
    horizon_ms: float = 300_000.0  # round 2's simulated time after the warm-up
    screen_ms: float = 60_000.0  # round 1's
    warmup_ms: float = 10_000.0
    seeds: int = 3
    keep: int = 5  # candidates in round 2
    jobs: int = 1  # processes

    def __post_init__(self) -> None:
        if not (
            isinstance(self.rate_per_s, (int, float))
            and math.isfinite(self.rate_per_s)
            and self.rate_per_s > 0
        ):
            raise ValueError(f"the request rate must be a finite number > 0, got {self.rate_per_s!r}")
        if not isinstance(self.request_tokens, int) or self.request_tokens < 2:
            raise ValueError(
                f"tuning at a rate needs --request-tokens of 2 or more (TPOT is over the tokens after the first), "
                f"got {self.request_tokens!r}"
            )
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose from {', '.join(OBJECTIVES)}")
        self._check_run()

    def _check_run(self) -> None:
        """The delay cap, the simulated times and the counts of seeds, candidates kept and jobs."""
        if self.max_delay_ms is not None and not (
            math.isfinite(self.max_delay_ms) and self.max_delay_ms >= 0
        ):
            raise ValueError(f"--max-delay-ms must be a finite number >= 0, got {self.max_delay_ms!r}")
        for name in ("horizon_ms", "screen_ms"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(self, name)!r}")
        if not (math.isfinite(self.warmup_ms) and self.warmup_ms >= 0):
            raise ValueError(f"warmup_ms must be a finite number >= 0, got {self.warmup_ms!r}")
        for name in ("seeds", "keep", "jobs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")


@dataclass(slots=True)
class RateCandidate:
    thresholds: tuple[int, ...]
    score: float  # the objective, ms: the mean over the runs
    latency: dict[str, dict[str, float]]  # SHOWN latencies' p50 / p99 / mean, each the mean over the runs
    throughput: float  # committed tokens per second, mean over the runs
    mean_batch: tuple[float, ...]  # rows per step of each model, mean over the runs
    backlog: int  # the most requests waiting at the cap at the end of a run
    behind: bool  # a run ended with more than 2N waiting: the rate is over what this B serves
    # the objective of each run, in seed order (the same arrivals per seed across candidates)
    scores: tuple[float, ...]
    # per model, the largest share of its steps (over the runs) with more rows than its step latency was measured at
    beyond: tuple[float, ...]

    @property
    def unpriced(self) -> bool:
        """More than BEYOND_SHARE of a model's steps were priced beyond the measured batch sizes."""
        return any(x > BEYOND_SHARE for x in self.beyond)

    def as_dict(self, models: tuple[str, ...]) -> dict:
        return {
            "thresholds": dict(zip(models, self.thresholds, strict=True)),
            "score_ms": self.score,
            "latency": self.latency,
            "throughput_tok_s": self.throughput,
            "mean_batch": dict(zip(models, self.mean_batch, strict=True)),
            "backlog": self.backlog,
            "behind": self.behind,
            "scores_ms": list(self.scores),
            "beyond_measured": dict(zip(models, self.beyond, strict=True)),
        }


@dataclass(slots=True)
class RateTuneResult:
    models: tuple[str, ...]
    concurrency: int
    settings: RateSettings
    fixed: dict[str, int]
    n_feasible: int
    # the candidates of the first round priced beyond the measured batch sizes (`RateCandidate.unpriced`)
    unpriced: int
    limits: tuple[int | float, ...]  # per model, the largest batch size measured (`measured_sizes`)
    screened: list[RateCandidate]  # round 1 (empty when every candidate went to round 2), best first
    results: list[RateCandidate] = field(default_factory=list)  # round 2, best first
    seconds: float = 0.0
    delta_ms: None = None  # no chain (`apply_tuning` records a δ only for the chain's tuning)

    @property
    def best(self) -> RateCandidate:
        return self.results[0]

    def best_thresholds(self) -> dict[str, int]:
        return dict(zip(self.models, self.best.thresholds, strict=True))

    def behind_best(self, c: RateCandidate) -> tuple[float, float, int]:
        """Candidate c against the best, seed by seed (the same arrivals): the mean and the standard deviation of
        its objective minus the best's, ms, and in how many seeds the best was lower."""
        d = [x - y for x, y in zip(c.scores, self.best.scores, strict=True)]
        mean = sum(d) / len(d)
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1)) if len(d) > 1 else math.nan
        return mean, sd, sum(1 for x in d if x > 0)

    def as_dict(self, top: int | None = None) -> dict:
        s = self.settings
        return {
            "method": "open-loop simulation",
            "concurrency": self.concurrency,
            "fixed": dict(self.fixed),
            "objective": s.objective,
            "request_rate_per_s": s.rate_per_s,
            "request_tokens": s.request_tokens,
            "max_delay_ms": s.max_delay_ms,
            "hop_ms": None if s.hop_ms is None else dict(zip(self.models, s.hop_ms, strict=True)),
            "gap_ms": None if s.gap_ms is None else dict(zip(self.models, s.gap_ms, strict=True)),
            "rounds": {
                "screen": {"candidates": len(self.screened), "seeds": 1, "horizon_ms": s.screen_ms},
                "final": {"candidates": len(self.results), "seeds": s.seeds, "horizon_ms": s.horizon_ms},
                "warmup_ms": s.warmup_ms,
            },
            "feasible_candidates": self.n_feasible,
            "beyond_measured": self.unpriced,
            "best": self.best_thresholds(),
            "score_ms": self.best.score,
            "throughput_tok_s": self.best.throughput,
            "seconds": round(self.seconds, 3),
            "candidates": [r.as_dict(self.models) for r in self.results[: top or None]],
        }


def arrivals(rate_per_s: float, until_ms: float, seed: int) -> tuple[float, ...]:
    """Poisson arrival times in [0, until_ms), ms: the same for every candidate run with this seed."""
    rng = np.random.default_rng([seed, 0x5EED])
    gap = 1000.0 / rate_per_s
    out: list[float] = []
    t = 0.0
    while t < until_ms:
        gaps = rng.exponential(gap, max(16, int((until_ms - t) / gap * 1.1) + 16))
        times = t + np.cumsum(gaps)
        out.extend(times[times < until_ms].tolist())
        t = float(times[-1])
    return (0.0, *out)  # the first request at 0, as the simulator's own Poisson loop has it


def measured_sizes(inputs: SystemInputs, measured: Collection[str] = ()) -> tuple[int | float, ...]:
    """Per model, the largest batch size its step latency was measured at; infinite for a latency given as one
    constant, unless the model is one of `measured` (a profile's: one point is then a measurement at that size).
    Where a model is priced by state, the larger of its two latencies' (beside its co-runners and alone): a size
    counts where either state measured it, as each state is common for one model and rare for the other (on one
    H200 profile the 0.6B's steps beside the 8B were measured at 1 row only, alone up to 11; the 8B's beside up to 4, alone
    up to 10). A step of more rows is priced as that size's (`StepLatency`), which makes a larger threshold look
    cheaper than it is: on the H200 the chain chose B_llm = 5 over a profile measured up to 4 rows, priced at
    7.34 ms, and the served 5-row steps took 9.55 ms."""
    out: list[int | float] = []
    for i, name in enumerate(inputs.models):
        curves = [inputs.step[i]] + ([a.step] if inputs.alone and (a := inputs.alone[i]) is not None else [])
        out.append(
            max(c.points[-1][0] if len(c.points) > 1 or name in measured else math.inf for c in curves)
        )
    return tuple(out)


def _run(
    inputs: SystemInputs, cfg: SimConfig
) -> tuple[dict, float, tuple[float, ...], tuple[dict[int, int], ...]]:
    sim = simulate(inputs, cfg)
    return sim.latency, sim.throughput, sim.mean_batch, sim.steps_by_batch


def tune_at_rate(
    inputs: SystemInputs,
    settings: RateSettings,
    fixed: Mapping[str, int] | None = None,
    measured: Collection[str] = (),
) -> RateTuneResult:
    """Rank the feasible thresholds by the open loop's latency (module docstring) and return them best first;
    `measured`: the models whose step latencies a profile measured (`measured_sizes`)."""
    n, m = inputs.concurrency, inputs.n_models
    fixed_idx = fixed_indices(inputs, fixed)
    pool = candidates(m, n, fixed_idx)
    top = measured_sizes(inputs, measured)
    free = sum(1 for i in range(m) if i not in fixed_idx)
    n_feasible = count_feasible(free, n - sum(v - 1 for v in fixed_idx.values()))
    s = settings
    probe = _config(s, pool[0], 0, (), s.horizon_ms)
    if error := steps_error(inputs, probe):
        raise TuneError(error)
    t0 = time.perf_counter()
    screened, results = _race(inputs, s, pool, top)
    unpriced = sum(c.unpriced for c in screened or results)
    return RateTuneResult(
        models=inputs.models,
        concurrency=n,
        settings=s,
        fixed={inputs.models[i]: v for i, v in sorted(fixed_idx.items())},
        n_feasible=n_feasible,
        unpriced=unpriced,
        limits=top,
        screened=screened,
        results=results,
        seconds=time.perf_counter() - t0,
    )


def _race(inputs: SystemInputs, s: RateSettings, pool: list[tuple[int, ...]], top: tuple[int | float, ...]):
    """Where the pool is larger than `s.keep`, every candidate simulated once over the screening horizon and the
    best kept; those run over the horizon with each seed's arrivals. Returns (the screened, the results), each
    best first."""
    n = inputs.concurrency
    with _Runner(inputs, s.jobs, top) as runner:
        screened: list[RateCandidate] = []
        if len(pool) > s.keep:
            times = arrivals(s.rate_per_s, s.warmup_ms + s.screen_ms, 0)
            screened = runner.rank(pool, [[_config(s, b, 0, times, s.screen_ms)] for b in pool], s, n)
            pool = [c.thresholds for c in screened[: s.keep]]
        per_seed = [arrivals(s.rate_per_s, s.warmup_ms + s.horizon_ms, k) for k in range(s.seeds)]
        cfgs = [[_config(s, b, k, per_seed[k], s.horizon_ms) for k in range(s.seeds)] for b in pool]
        return screened, runner.rank(pool, cfgs, s, n)


def _config(
    s: RateSettings, b: tuple[int, ...], seed: int, times: tuple[float, ...], horizon_ms: float
) -> SimConfig:
    return SimConfig(
        b, horizon_ms=horizon_ms, warmup_ms=s.warmup_ms, seed=seed, request_tokens=s.request_tokens,
        max_delay_ms=s.max_delay_ms, hop_ms=s.hop_ms, gap_ms=s.gap_ms, arrivals_ms=times or (0.0,),
    )  # fmt: skip


class _Runner:
    """Runs simulations, in `jobs` processes where more than one is asked for."""

    def __init__(self, inputs: SystemInputs, jobs: int, limits: tuple[int | float, ...]) -> None:
        self.inputs, self.jobs, self.limits, self.pool = inputs, jobs, limits, None

    def __enter__(self) -> _Runner:
        if self.jobs > 1:
            self.pool = concurrent.futures.ProcessPoolExecutor(self.jobs)
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def rank(
        self, pool: list[tuple[int, ...]], cfgs: list[list[SimConfig]], s: RateSettings, n: int
    ) -> list[RateCandidate]:
        """Each candidate of `pool` run at its configurations (one, or one per seed), best first."""
        flat = [c for per in cfgs for c in per]
        if self.pool is None:
            outs = [_run(self.inputs, c) for c in flat]
        else:
            outs = list(self.pool.map(_run, [self.inputs] * len(flat), flat, chunksize=1))
        ranked, k = [], 0
        for b, per in zip(pool, cfgs, strict=True):
            ranked.append(self._candidate(b, outs[k : k + len(per)], s, n))
            k += len(per)
        # keeping up and priced within the measurements first, then the objective (a run that measured no request:
        # last, the most throughput first), then the thresholds
        return sorted(ranked, key=_rank_key)

    def _candidate(self, b: tuple[int, ...], runs: list, s: RateSettings, n: int) -> RateCandidate:
        """Thresholds b's figures over its runs (one, or one per seed): each the mean of the runs'."""
        key, q = OBJECTIVES[s.objective]
        lat = [r[0] for r in runs]
        backlog = max(x["backlog"] for x in lat)
        return RateCandidate(
            thresholds=b,
            score=_mean(x[key][q] for x in lat),
            latency={
                name: {st: _mean(x[name][st] for x in lat) for st in ("p50", "p99", "mean")} for name in SHOWN
            },  # fmt: skip
            throughput=_mean(r[1] for r in runs),
            mean_batch=tuple(_mean(r[2][i] for r in runs) for i in range(len(b))),
            backlog=backlog,
            behind=backlog > 2 * n,
            scores=tuple(x[key][q] for x in lat),
            beyond=tuple(map(max, zip(*(beyond_shares(r[3], self.limits) for r in runs), strict=True))),
        )


def beyond_shares(by_batch: tuple[dict[int, int], ...], limits: tuple[int | float, ...]) -> tuple[float, ...]:
    """Per model, the share of its steps (`SimResult.steps_by_batch`) with more rows than its limit."""
    return tuple(_share_above(steps, limit) for steps, limit in zip(by_batch, limits, strict=True))


def beyond_warnings(
    models: tuple[str, ...], shares: tuple[float, ...], limits: tuple[int | float, ...]
) -> list[str]:
    """A warning per model that ran more than BEYOND_SHARE of its simulated steps with more rows than its step
    latency was measured at (`beyond_shares`, `measured_sizes`)."""
    return [
        f"{share:.0%} of {m}'s simulated steps had more than {limit} rows, the largest batch size its step latency "
        f"was measured at; priced as {limit} rows, they look cheaper than they are (profile the plan at this load "
        "for the latencies of those batch sizes)"
        for m, share, limit in zip(models, shares, limits, strict=True)
        if share > BEYOND_SHARE
    ]


def _share_above(by_batch: dict[int, int], limit: int | float) -> float:
    """The share of steps with more rows than `limit`."""
    total = sum(by_batch.values())
    return sum(k for b, k in by_batch.items() if b > limit) / total if total else 0.0


def _mean(values) -> float:
    xs = list(values)
    return math.nan if not xs or any(math.isnan(x) for x in xs) else sum(xs) / len(xs)


def _rank_key(c: RateCandidate) -> tuple:
    return (c.behind, c.unpriced, math.isnan(c.score), _or_inf(c.score), -c.throughput, c.thresholds)


def _or_inf(x: float) -> float:
    return math.inf if math.isnan(x) else x
