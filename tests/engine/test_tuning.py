"""`EngineTuning`: the GPU fast path's tuning, validated field by field and carried by `EngineConfig` to the
attention backend's config."""

from __future__ import annotations

import pytest

from tokenrouter.runtime.engine.config import EngineTuning
from tokenrouter.runtime.engine.embedded import EngineConfig


def test_the_defaults_are_what_the_engine_runs():
    tuning = EngineTuning()
    assert (tuning.gemv_rows_batch_max, tuning.gemv_rows_max) == (2, 2)
    assert (tuning.dot_rows_max, tuning.dot_rows_decode_max) == (None, 16)
    assert (tuning.fused_merge_rows, tuning.fused_merge_passes, tuning.attn_split_rows) == (4, 1, 256)
    assert tuning.tuned_tiles and tuning.pdl and tuning.tuned_tiles_files == ()
    assert EngineConfig().tuning == tuning


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("gemv_rows_max", 9, "tuning.gemv_rows_max must be an int from 2 to 8, got 9"),
        ("gemv_rows_max", 1, "tuning.gemv_rows_max must be an int from 2 to 8, got 1"),
        ("gemv_rows_batch_max", -1, "tuning.gemv_rows_batch_max must be an int"),
        ("dot_rows_max", 33, "tuning.dot_rows_max must be an int from 2 to 32, got 33"),
        ("dot_rows_max", True, "tuning.dot_rows_max must be an int from 2 to 32, got True"),
        ("dot_rows_decode_max", "16", "tuning.dot_rows_decode_max must be an int from 2 to 32, got '16'"),
        ("fused_merge_rows", 0, "tuning.fused_merge_rows must be an int from 1 to 64, got 0"),
        ("fused_merge_passes", 17, "tuning.fused_merge_passes must be an int from 0 to 16, got 17"),
        ("attn_split_rows", 63, "tuning.attn_split_rows must be an int from 64 to 65536, got 63"),
        ("tuned_tiles", "no", "tuning.tuned_tiles must be true or false, got 'no'"),
        ("pdl", 0, "tuning.pdl must be true or false, got 0"),
        ("tuned_tiles_files", "tiles.json", "tuning.tuned_tiles_files must be a list of file paths"),
        ("tuned_tiles_files", ("",), "tuning.tuned_tiles_files must be a list of file paths"),
    ],
)
def test_a_bad_field_is_named(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EngineTuning(**{field: value})


def test_files_become_a_tuple_and_the_engine_config_checks_its_type():
    assert EngineTuning(tuned_tiles_files=["a.json", "b.json"]).tuned_tiles_files == ("a.json", "b.json")
    with pytest.raises(ValueError, match="tuning must be an EngineTuning, got dict"):
        EngineConfig(tuning={"pdl": False})
