"""The one plotting module (`tokenrouter.plotting`) that `tune --plot`, `eval --plot`, `trace --png` and the bench
scripts draw with: the figure written at its size, and nothing written (and nothing left open) on an error."""

from __future__ import annotations

import struct

import pytest

from tokenrouter.plotting import MODEL_COLORS, figure, model_colors, pyplot


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_a_figure_is_written_at_its_size_and_closed(tmp_path):
    plt = pyplot()
    with figure(tmp_path / "a.png", (7, 4), dpi=110) as (fig, ax):
        ax.plot([0, 1], [1, 0])
    assert png_size(tmp_path / "a.png") == (770, 440)
    assert not plt.fignum_exists(fig.number)
    with figure(tmp_path / "b.png", (10, 4), dpi=120, ncols=2, squeeze=False) as (_, axes):
        assert axes.shape == (1, 2)
    assert png_size(tmp_path / "b.png") == (1200, 480)


def test_an_error_while_drawing_writes_nothing_and_closes_the_figure(tmp_path):
    plt = pyplot()
    with pytest.raises(ZeroDivisionError), figure(tmp_path / "c.png", (4, 3)) as (fig, _):
        1 / 0  # noqa: B018
    assert not (tmp_path / "c.png").exists() and not plt.fignum_exists(fig.number)


def test_model_colours_follow_the_model_order():
    assert model_colors(["slm", "llm"]) == {"slm": MODEL_COLORS[0], "llm": MODEL_COLORS[1]}
    many = model_colors([f"m{i}" for i in range(len(MODEL_COLORS) + 1)])
    assert many[f"m{len(MODEL_COLORS)}"] == MODEL_COLORS[0]
