"""bench/eager_warm_check.py on CPU: its sample of eager steps (the GPU part needs CUDA)."""


def test_the_sample_is_seeded_and_no_step_fits_a_captured_graph(bench_script):
    from tokenrouter.runtime.engine.cuda_graph_runner import CudaGraphConfig, CudaGraphRunner

    check = bench_script("eager_warm_check")
    steps = check.sample_steps(40, seed=0)
    assert steps == check.sample_steps(40, seed=0) and steps != check.sample_steps(40, seed=1)
    assert [kind for kind, _ in steps[:4]] == list(check.KINDS)
    runner = CudaGraphRunner.__new__(CudaGraphRunner)  # the default buckets, nothing captured
    runner.config = CudaGraphConfig()
    runner._init_buckets()
    for kind, rows in steps:
        news = [n for _, n in rows]
        assert runner.bucket(len(rows), max(news)) is None, (kind, len(rows), max(news))
        held = [i for i, _ in rows if i is not None]
        assert len(set(held)) == len(held) and all(0 <= i < check.HELD for i in held)
        assert (kind == "prefill") == (rows[0][0] is None)


def test_without_a_gpu_it_says_so(bench_script, capsys):
    import torch

    check = bench_script("eager_warm_check")
    if torch.cuda.is_available():
        return
    assert check.main(["--shape", "qwen3-0.6b"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
