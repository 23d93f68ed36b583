"""The simulator's settings (`SimConfig`, checked as it is made) and its result (`SimResult`); the bound on the
steps a run may take (`steps_error`). The simulation itself: `simulate.py`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tokenrouter.throughput.inputs import SystemInputs


@dataclass(slots=True)
class SimConfig:
    thresholds: tuple[int, ...]
    horizon_ms: float = 60_000.0  # simulated time measured (after the warm-up)
    warmup_ms: float = 2_000.0
    seed: int = 0
    request_tokens: int | None = None  # None: requests never finish (the chain's closed system)
    think_ms: float = 0.0
    burstiness: float = 1.0  # squared coefficient of variation of think times (>= 1)
    max_delay_ms: float | None = None  # None: no timeout
    requests: tuple[np.ndarray, ...] | None = None  # a finite run: each request's own routing matrix
    # a finite run's requests' own token counts, in their order (None: `request_tokens` each)
    request_lengths: tuple[int, ...] | None = None
    hop_ms: tuple[float, ...] | None = None  # per target model: a hop's transit to it; None: instant
    # per model, host time each step takes beyond its step latency (the loop's gap between back-to-back steps,
    # `tokenrouter_step_gap_seconds_total`, the profile's `workload.gap_ms`); None: none
    gap_ms: tuple[float, ...] | None = None
    # the runtime's rule that a model also steps when every request it holds (has run and not seen end) is
    # queued there (`runtime.subserver.batching`, "Nobody else to wait for"); False: as servers before it did
    held_rule: bool = True
    # a what-if refinement of that rule (not in the runtime): a request away from a model for longer than this
    # no longer counts as held there (None: it counts until it ends, as the runtime has it)
    held_away_ms: float | None = None
    # another what-if: step once the requests away are expected to bring fewer than this many rows back within
    # what is left of the timeout, each at its own rate of leaving the model (times left / time since its first
    # step there), as a Poisson process: sum of 1 - exp(-rate * left_ms) (None: the runtime's rule)
    held_expect: float | None = None
    # an open loop: requests arrive at this rate (Poisson), at most N in flight (None: a closed loop)
    arrival_rate_per_s: float | None = None
    # an open loop's arrival times instead, ms, ascending: the same arrivals for runs at other thresholds
    # (`rate_tune`), or a served run's (`workload.read_arrivals`); the run ends when the last one's request has
    # ended, or at the horizon
    arrivals_ms: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        self._check_run()
        self._check_what_ifs()
        for name in ("hop_ms", "gap_ms"):
            if (v := getattr(self, name)) is not None:
                setattr(self, name, tuple(float(x) for x in v))
                if any(not (math.isfinite(x) and x >= 0) for x in getattr(self, name)):
                    raise ValueError(f"{name} must be finite numbers >= 0, got {v!r}")
        if self.requests is not None:
            if self.request_tokens is None or not self.requests:
                raise ValueError("requests (a finite run) needs request_tokens and at least one request")
            self.requests = tuple(np.asarray(p, dtype=float) for p in self.requests)
        self._check_open_loop()
        if self.request_lengths is not None:
            self.request_lengths = tuple(self.request_lengths)
            if self.requests is None or len(self.request_lengths) != len(self.requests):
                raise ValueError("request_lengths needs requests (a finite run), one length each")
            if any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in self.request_lengths):
                raise ValueError(f"request_lengths must be ints >= 1, got {self.request_lengths!r}")

    def _check_run(self) -> None:
        """The thresholds, times, seed, request length, think-time spread and timeout."""
        if not self.thresholds or any(not isinstance(b, int) or b < 1 for b in self.thresholds):
            raise ValueError(f"thresholds must be ints >= 1, got {self.thresholds!r}")
        for name in ("horizon_ms", "warmup_ms", "think_ms"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.horizon_ms <= 0:
            raise ValueError("horizon_ms must be > 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        self._check_requests()

    def _check_requests(self) -> None:
        """The request length, think-time spread and timeout."""
        if self.request_tokens is not None and (
            not isinstance(self.request_tokens, int) or self.request_tokens < 1
        ):
            raise ValueError(f"request_tokens must be an int >= 1 or None, got {self.request_tokens!r}")
        if not (
            isinstance(self.burstiness, (int, float))
            and self.burstiness >= 1
            and math.isfinite(self.burstiness)
        ):
            raise ValueError(
                f"burstiness (squared coefficient of variation) must be >= 1, got {self.burstiness!r}"
            )
        if self.max_delay_ms is not None and not (
            self.max_delay_ms >= 0 and math.isfinite(self.max_delay_ms)
        ):
            raise ValueError(f"max_delay_ms must be a finite number >= 0, got {self.max_delay_ms!r}")

    def _check_what_ifs(self) -> None:
        """`held_away_ms` and `held_expect`: each a refinement of the held rule, one at a time."""
        if self.held_away_ms is not None and not (
            self.held_rule and self.held_away_ms >= 0 and math.isfinite(self.held_away_ms)
        ):
            raise ValueError(
                f"held_away_ms must be a finite number >= 0 with held_rule, got {self.held_away_ms!r}"
            )
        if self.held_expect is not None and not (
            self.held_rule
            and self.held_away_ms is None
            and self.max_delay_ms is not None
            and self.held_expect > 0
            and math.isfinite(self.held_expect)
        ):
            raise ValueError(
                "held_expect must be a finite number > 0, with held_rule and max_delay_ms and without "
                f"held_away_ms, got {self.held_expect!r}"
            )

    def _check_open_loop(self) -> None:
        """An arrival rate or ascending arrival times, not both, with requests that end and no think time."""
        if self.arrival_rate_per_s is not None and not (
            math.isfinite(self.arrival_rate_per_s) and self.arrival_rate_per_s > 0
        ):
            raise ValueError(f"the arrival rate must be a finite number > 0, got {self.arrival_rate_per_s!r}")
        if self.arrivals_ms is not None:
            self.arrivals_ms = tuple(float(x) for x in self.arrivals_ms)
            if self.arrival_rate_per_s is not None:
                raise ValueError("an open loop takes an arrival rate or arrival times, not both")
            if any(not (math.isfinite(x) and x >= 0) for x in self.arrivals_ms) or any(
                b < a for a, b in zip(self.arrivals_ms, self.arrivals_ms[1:], strict=False)
            ):
                raise ValueError("arrival times must be finite numbers of ms >= 0, in ascending order")
        if self.arrival_rate_per_s is not None or self.arrivals_ms is not None:
            if self.request_tokens is None or self.requests is not None or self.think_ms > 0:
                raise ValueError(
                    "an open loop (an arrival rate) needs request_tokens, and takes neither requests (a finite run)"
                    " nor think_ms (a closed loop's)"
                )


@dataclass(slots=True)
class SimResult:
    thresholds: tuple[int, ...]
    throughput: float  # committed tokens per second
    tokens: float
    time_ms: float
    utilization: tuple[float, ...]
    mean_batch: tuple[float, ...]
    mean_queue: tuple[float, ...]
    steps_per_s: tuple[float, ...]
    steps_by_batch: tuple[dict[int, int], ...]  # per model, the measured steps by their rows
    finished_requests: int
    stalled: bool  # every model idle with nothing able to start (only without a timeout)
    # an open loop's: {"queued_ms"|"ttft_ms"|"tpot_ms"|"e2e_ms"|"from_arrival_ms": {"mean", "p50", "p99"},
    # "measured": requests, "unfinished": measured arrivals not ended, "backlog": waiting at the cap at the end}
    latency: dict | None = None

    def as_dict(self, models: tuple[str, ...]) -> dict:
        return {
            "thresholds": dict(zip(models, self.thresholds, strict=True)),
            "throughput_tok_s": self.throughput,
            "simulated_ms": self.time_ms,
            "utilization": dict(zip(models, self.utilization, strict=True)),
            "mean_batch": dict(zip(models, self.mean_batch, strict=True)),
            "mean_queue": dict(zip(models, self.mean_queue, strict=True)),
            "steps_per_s": dict(zip(models, self.steps_per_s, strict=True)),
            "steps_by_batch": {
                m: {str(b): k for b, k in d.items()} for m, d in zip(models, self.steps_by_batch, strict=True)
            },
            "finished_requests": self.finished_requests,
            "stalled": self.stalled,
            **({"latency": self.latency} if self.latency is not None else {}),
        }


# the most steps `steps_error` lets a run simulate: each takes some µs of Python, so 1e8 of them take hours
MAX_SIM_STEPS = 100_000_000


def steps_error(inputs: SystemInputs, cfg: SimConfig) -> str | None:
    """The message when the run's simulated time (warm-up and horizon) allows more than `MAX_SIM_STEPS` steps,
    each model stepping back to back at its shortest step; None otherwise, and for a finite run (`requests`),
    which ends with its last request."""
    if cfg.requests is not None:
        return None
    lone = inputs.alone or (None,) * inputs.n_models
    per_ms = sum(  # steps per ms at most
        1.0 / min(ms for _, ms in (*s.points, *(a.step.points if a is not None else ())))
        for s, a in zip(inputs.step, lone, strict=True)
    )
    steps = (cfg.warmup_ms + cfg.horizon_ms) * per_ms
    if steps <= MAX_SIM_STEPS:
        return None
    most = MAX_SIM_STEPS / per_ms - cfg.warmup_ms
    return (
        f"--horizon-ms {cfg.horizon_ms:g} after --warmup-ms {cfg.warmup_ms:g} could take up to {steps:.3g} "
        f"steps of the models at their shortest step latencies, more than the {MAX_SIM_STEPS:.0e} a run may "
        + (f"simulate: give --horizon-ms {most:.6g} or less" if most > 0 else "simulate: shorten --warmup-ms")
    )
