"""What a search for B* returns (`TuneResult`) and the size of its feasible candidate set: shared by the
exhaustive search (`optimize.py`) and the sampled one (`large_n.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import comb

from tokenrouter.throughput.dtmc import ChainResult


@dataclass(slots=True)
class TuneResult:
    models: tuple[str, ...]
    concurrency: int
    delta_ms: float
    fixed: dict[str, int]
    method: str  # "exhaustive" (every chain solved) or `large_n.METHOD` (sampled)
    n_feasible: int  # size of the feasible candidate set
    results: list[ChainResult] = field(default_factory=list)  # evaluated candidates, best first
    failed: dict[tuple[int, ...], str] = field(default_factory=dict)  # candidates whose chain failed
    seconds: float = 0.0
    sampling: dict | None = None  # the sampled search's settings (`large_n.py`); None: every chain solved
    chosen: int = (
        0  # index in `results` of the candidate chosen (0, the chain's best, unless `tune` kept another)
    )

    @property
    def best(self) -> ChainResult:
        return self.results[self.chosen]

    def best_thresholds(self) -> dict[str, int]:
        return dict(zip(self.models, self.best.thresholds, strict=True))

    def as_dict(self, top: int | None = None) -> dict:
        shown = self.results if top is None else self.results[:top]
        return {
            "concurrency": self.concurrency,
            "delta_ms": self.delta_ms,
            "fixed": dict(self.fixed),
            "method": self.method,
            "feasible_candidates": self.n_feasible,
            "evaluated": len(self.results) + len(self.failed),
            "best": self.best_thresholds(),
            "throughput_tok_s": self.best.throughput,
            "seconds": round(self.seconds, 3),
            "candidates": [r.as_dict(self.models) for r in shown],
            "failed": {",".join(map(str, b)): msg for b, msg in self.failed.items()},
            **({"sampling": self.sampling} if self.sampling else {}),
        }


def feasible(b: tuple[int, ...], n: int) -> bool:
    return sum(x - 1 for x in b) < n


def count_feasible(k: int, budget: int) -> int:
    """Number of (x_1..x_k) ≥ 0 with Σ x < budget, each x ≤ N − 1 (implied): C(budget − 1 + k, k)."""
    if budget <= 0:
        return 0
    return comb(budget - 1 + k, k)
