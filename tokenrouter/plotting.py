"""Charts drawn with matplotlib (a dev dependency, imported only when a chart is drawn), off-screen (the Agg
backend: no display needed), for `tune --plot`, `eval --plot`, `trace --png` and the benchmark scripts.

The model colours are the playground page's (runtime/frontend/static/playground.html), in the plan's model
order, so a model has one colour in every picture of a policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MODEL_COLORS = ("#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f")


def model_colors(models: list[str]) -> dict[str, str]:
    return {x: MODEL_COLORS[i % len(MODEL_COLORS)] for i, x in enumerate(models)}


def pyplot():
    """matplotlib.pyplot on the Agg backend; ImportError where matplotlib is not installed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextmanager
def figure(path: str | Path, figsize: tuple[float, float], dpi: int = 110, **subplots) -> Iterator[tuple]:
    """(fig, axes) of `plt.subplots(**subplots)`; on leaving, the layout tightened and the figure written to
    `path` (a PNG at `dpi`) and closed. The figure is closed on an error too, and nothing is written."""
    plt = pyplot()
    fig, axes = plt.subplots(figsize=figsize, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
