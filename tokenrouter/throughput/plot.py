"""`tune --plot`: T(B) over the evaluated candidates (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.plotting import figure
from tokenrouter.throughput.optimize import TuneResult


def plot_tuning(result: TuneResult, path: str | Path, title: str = "") -> None:
    free = [i for i, m in enumerate(result.models) if m not in result.fixed]
    best = result.best.thresholds
    with figure(path, (7, 4), dpi=110) as (_, ax):
        _draw(ax, result, free, best, title)


def _draw(ax, result: TuneResult, free: list[int], best: tuple, title: str) -> None:
    if len(free) == 1:
        i = free[0]
        pts = sorted((r.thresholds[i], r.throughput) for r in result.results)
        ax.plot([b for b, _ in pts], [t for _, t in pts], marker="o")
        ax.axvline(best[i], color="tab:red", linestyle="--", label=f"B* = {best[i]}")
        ax.set_xlabel(f"B_{result.models[i]}")
        ax.legend()
    else:
        shown = sorted(result.results[:30], key=lambda r: r.thresholds)
        labels = [",".join(map(str, r.thresholds)) for r in shown]
        colors = ["tab:red" if r.thresholds == best else "tab:blue" for r in shown]
        ax.bar(range(len(shown)), [r.throughput for r in shown], color=colors)
        ax.set_xticks(range(len(shown)), labels, rotation=90, fontsize=7)
        ax.set_xlabel("B = (" + ", ".join(result.models) + ")")
    ax.set_ylabel("T(B), committed tokens/s")
    ax.set_title(title or f"Delayed-batching thresholds, N = {result.concurrency} ({result.method} search)")
