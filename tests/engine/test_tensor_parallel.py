"""Tensor parallelism on CPU: a model over 2 and 4 gloo ranks (rank 0 in this process, the others spawned) gives the
logits and hidden states of the same model on one rank, at prefill, decode, hold→extend and a prefix-cache hit."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from tokenrouter.runtime.engine.base import StepInput
from tokenrouter.runtime.engine.config import ModelFolderError, load_model_config
from tokenrouter.runtime.engine.embedded import load_engine
from tokenrouter.runtime.engine.make_model import make_model, shape_for
from tokenrouter.runtime.engine.models.tp_layers import shard_config
from tokenrouter.runtime.engine.parallel import TPError
from tokenrouter.runtime.prefix_cache import PrefixCachingEngine
from tokenrouter.runtime.subserver.tp_worker import load_tp_engine

REPO = Path(__file__).resolve().parents[2]
TINY_SMALL = REPO / "examples" / "models" / "tiny-small"
TINY_LARGE = REPO / "examples" / "models" / "tiny-large"
SETTINGS = dict(max_tokens=1024, max_batch=8, engine_class=PrefixCachingEngine)
PREFIX = [(5 * i + 3) % 500 for i in range(20)]  # more than one prefix-cache block (16 tokens)


def run_steps(engine) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Prefill of two rows, a decode, an extend of one row while the other is held, a mixed step with a new
    row, a new request in a released one's request row, then a request whose prompt starts with a released one's (its KV comes from the prefix cache); and an
    embedding lookup and a teacher-forced pass."""
    steps = [
        [StepInput("a", PREFIX), StepInput("b", [7, 8, 9])],
        [StepInput("a", [6]), StepInput("b", [10])],
        [StepInput("a", [11, 12, 13])],  # b is held
        [StepInput("b", [14]), StepInput("c", [3, 3, 3, 3])],
    ]
    out = []
    for rows in steps:
        s = engine.forward(rows, want_hidden=True)
        out.append((s.logits, s.hidden))
    engine.release("a")
    # "e" takes a's request row, so "d" gets a row whose table a follower has never seen a step write
    for rows in ([StepInput("e", [9, 9])], [StepInput("d", [*PREFIX, 1, 2])]):
        s = engine.forward(rows, want_hidden=True)
        out.append((s.logits, s.hidden))
    out.append((engine.embed(torch.tensor([1, 255, 256, 511])), engine.embed(torch.tensor([0]))))
    out.append(engine.forward_full([4, 5, 6, 7]))
    return out


def assert_same(path, ranks: int, **kw) -> None:
    want = run_steps(load_engine(path, **SETTINGS, **kw))
    engine = load_tp_engine(str(path), ["cpu"] * ranks, threads=1, **SETTINGS, **kw)
    try:
        assert engine.model.config.num_key_value_heads == load_model_config(path).num_key_value_heads // ranks
        assert engine.token_to_kv_pool.head_num * ranks == load_model_config(path).num_key_value_heads
        got = run_steps(engine)
        assert engine.stats()["tp"] == ranks
    finally:
        engine.close_group()
    assert engine.cache.tokens > 0 and engine.matched_tokens >= 16  # "d" started from a's cached blocks
    for (wl, wh), (gl, gh) in zip(want, got, strict=True):
        assert gl.shape == wl.shape and gh.shape == wh.shape
        torch.testing.assert_close(gl, wl, atol=1e-4, rtol=0)
        torch.testing.assert_close(gh, wh, atol=1e-4, rtol=0)


def test_two_ranks_match_one_qwen3():
    assert_same(TINY_LARGE, 2)


def test_four_ranks_match_one_qwen3():
    assert_same(TINY_LARGE, 4)


@pytest.mark.parametrize("variant", ["qwen2", "llama"])
def test_two_ranks_match_one_other_families(model_dirs, variant):
    assert_same(model_dirs[variant], 2)


def test_vocabulary_not_divisible_by_the_ranks(tmp_path):
    """An untied LM head over a vocabulary of 515 rows: the second rank's slice has a padding row."""
    path = make_model(tmp_path / "odd", shape_for("tiny", arch="llama", vocab=515, tie=False), seed=3)
    assert_same(path, 2)


def test_a_tp_that_does_not_divide_the_model_is_refused():
    config = load_model_config(TINY_SMALL)  # 4 heads, 2 KV heads, intermediate 128
    with pytest.raises(ModelFolderError, match=r"num_key_value_heads \(2\) is not divisible by the 4 GPUs"):
        shard_config(config, 4)
    with pytest.raises(ModelFolderError, match="not divisible by the 3 GPUs"):
        load_tp_engine(str(TINY_SMALL), ["cpu"] * 3, max_tokens=64)


def test_a_dead_rank_fails_the_next_step():
    engine = load_tp_engine(str(TINY_SMALL), ["cpu"] * 2, threads=1, max_tokens=256, max_batch=4)
    engine.forward([StepInput("a", [1, 2, 3])])
    follower = engine.tp.followers[0]
    os.kill(follower.pid, signal.SIGKILL)
    follower.join(10)
    with pytest.raises(TPError, match="rank 1 of 2 exited"):
        engine.stats()
    with pytest.raises(TPError, match="rank 1 of 2 exited"):
        engine.forward([StepInput("a", [4])])
    engine.tp.followers = []  # unseen by the process check: the collectives themselves fail, at once
    start = time.monotonic()
    with pytest.raises(TPError, match="failed on rank 0 of 2"):
        engine.forward([StepInput("a", [4])])
    assert time.monotonic() - start < 5


def test_a_rank_that_fails_to_start_is_named_at_once():
    """Rank 1 on a device it cannot use exits while the group forms: rank 0 says so, without waiting for it."""
    start = time.monotonic()
    with pytest.raises(TPError, match=r"rank 1 of 2 exited \(status 1\) while"):
        load_tp_engine(str(TINY_SMALL), ["cpu", "cuda:7"], threads=1, max_tokens=64)
    assert time.monotonic() - start < 60
