"""The CUDA graphs' shapes follow the plan's concurrency (`CudaGraphConfig.for_rows`): at high concurrency a
model's steps are wide mixed batches (a few returns from a peer among many decode rows), which ran eagerly
while the extend graphs stopped at 16 rows."""

import json

from tokenrouter.runtime.engine.cuda_graph_runner import (
    DEFAULT_DECODE_BS,
    DEFAULT_EXTEND_BS,
    CudaGraphConfig,
)


def runs_in_graph(config: CudaGraphConfig, bs: int, q: int) -> bool:
    if q == 1 and any(b >= bs for b in config.decode_batch_sizes):
        return True
    return any(b >= bs and cq >= q for b, cq in config.shapes() if cq > 1)


def test_default_rows_keep_the_default_shapes():
    for rows in (None, 1, 8, 16):
        c = CudaGraphConfig.for_rows(rows)
        assert c.decode_batch_sizes == DEFAULT_DECODE_BS
        assert c.extend_batch_sizes == DEFAULT_EXTEND_BS


def test_wide_mixed_steps_run_in_a_graph_up_to_the_rows():
    default = CudaGraphConfig()
    assert not runs_in_graph(default, 58, 2)  # the eager step the wider shapes are for
    for rows in (32, 64, 100, 128):
        c = CudaGraphConfig.for_rows(rows)
        assert c.decode_batch_sizes[-1] == max(rows, DEFAULT_DECODE_BS[-1])
        assert c.extend_batch_sizes[-1] == rows
        for bs in range(1, rows + 1):
            assert runs_in_graph(c, bs, 1), (rows, bs)
            assert runs_in_graph(c, bs, 2), (rows, bs)
        assert all(bs * q <= c.max_extend_tokens for bs, q in c.shapes() if q > 1)


def test_a_plan_gives_its_concurrency_to_the_engine(tmp_path):
    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.runtime.subserver.loading import load_model_engine

    res = compile_file("examples/bernoulli.tr", {})
    assert res.plan is not None
    plan = json.loads(json.dumps(res.plan))
    plan["serve"]["concurrency"] = 48
    engine = load_model_engine(plan, "slm", "cpu", max_tokens=256)
    assert engine.settings.graph_rows == 48
