"""bench/step_partner.py without a GPU: its points are parsed (and a bad one named) before it asks for CUDA."""

from __future__ import annotations

import pytest


@pytest.fixture
def partner(bench_script):
    return bench_script("step_partner")


def test_a_decode_is_not_a_point(partner):
    with pytest.raises(SystemExit, match="--points: '4x1' is not BSxQ"):
        partner.main(["--points", "1x8,4x1"])


def test_needs_a_gpu(partner, capsys):
    if partner.torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert partner.main(["--points", "1x8"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_an_unknown_phase_is_named(partner, capsys):
    with pytest.raises(SystemExit):
        partner.main(["--phases", "alloc,reboot"])
    assert (
        "--phases: unknown reboot; expected alloc, eager, tiny, pinned, warm, one_nopdl, one, capture, drop"
        in capsys.readouterr().err
    )
