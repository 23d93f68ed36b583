"""bench/pdl_timeline.py's parts that need no GPU: the step parser, the occupancy rule, and how a traced
step's launches become per-launch figures and per-layer segments (a synthetic timeline with known answers).
The trace itself (`DotTrace`) reads the GPU's timer; its kernel variant is compiled for sm_90 in
tests/engine_gpu/test_compile_sm90.py, and on CPU it refuses to start."""

from __future__ import annotations

import pytest


@pytest.fixture
def timeline(bench_script):
    return bench_script("pdl_timeline")


def test_parse_steps(timeline):
    assert timeline.parse_steps("4x1, 1x8,4X8") == [(4, 1), (1, 8), (4, 8)]
    for bad in ("", "4", "4x", "0x8", "ax8", "4x0"):
        with pytest.raises(SystemExit):
            timeline.parse_steps(bad)


def test_fit_per_sm_counts_registers_per_warp_in_units_of_256(timeline):
    # 255 registers: 8,160 per warp, allocated as 8,192; 4 warps -> 32,768 of 65,536: two programs
    assert timeline.fit_per_sm(255, 48 * 1024, 4) == 2
    assert timeline.fit_per_sm(94, 24 * 1024, 4) == 5  # 3,008 -> 3,072 per warp: five by registers
    assert timeline.fit_per_sm(32, 100 * 1024, 4) == 2  # shared memory: 228 KB / 101 KB
    assert timeline.fit_per_sm(32, 0, 16) == 4  # warps: 64 / 16


def _launch(n, k, t0, starts, waited_after, end_after):
    """A launch whose programs start at t0 + starts[i] (ns), all released at t0 + waited_after."""
    tl = [[t0 + s, max(t0 + s, t0 + waited_after), t0 + end_after, i % 3] for i, s in enumerate(starts)]
    return dict(n=n, k=k, rows=8, timeline=tl)


def test_segments_of_a_synthetic_two_layer_step(timeline):
    names = timeline.roles(hidden=1024, q_dim=2048, kv_dim=1024, inter=3072)
    shapes = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]
    launches, t = [], 0
    # per layer: each linear kernel released 1 µs after its programs start (half of them start 1 µs
    # late, after the release), runs 5 µs after the release; 2 µs between kernels (qkv -> o: 7 µs)
    gaps = {0: 7000, 1: 2000, 2: 0, 3: 2000}
    for _layer in range(2):
        for j, (n, k) in enumerate(shapes):
            launches.append(_launch(n, k, t, [0, 0, 2000, 2000], 1000, 6000))
            t += 6000 + gaps[j] - 1000  # the next launch starts 1 µs before its release
    launches.append(_launch(151936, 1024, t, [0], 1000, 3000))  # the LM head ends the layers
    stats = [timeline.launch_stats(x) for x in launches]
    first = stats[0]
    assert first["programs"] == 4 and first["sms"] == 3
    assert first["early"] == 0.5 and first["lead_us"] == 1.0 and first["late_start_us"] == 1.0
    assert first["exposed_us"] == 5.0
    seg = timeline.layer_segments(stats, names)
    assert seg["qkv"] == [5.0, 5.0] and seg["down"] == [5.0, 5.0]
    assert seg["qkv>o"] == [7.0, 7.0] and seg["o>gate_up"] == [2.0, 2.0] and seg["gate_up>down"] == [0.0, 0.0]
    assert seg["down>qkv"] == [2.0]  # the last layer's down is followed by the LM head, not a q/k/v


def test_dot_trace_refuses_the_cpu():
    from tokenrouter.runtime.engine.attention.triton_kernels import DotTrace

    with pytest.raises(ValueError, match="CUDA only"):
        DotTrace("cpu")
