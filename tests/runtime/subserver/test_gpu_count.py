"""`serve` refuses a plan whose models ask for more GPUs than the machine has, naming both numbers; on CPU no
count applies."""

from __future__ import annotations

from tokenrouter.runtime.subserver.loading import gpu_count_problem

PLAN = {"models": {"slm": {"gpus": [0]}, "llm": {"gpus": [0, 1]}}}


def test_more_gpus_than_the_machine_has_is_named():
    problem = gpu_count_problem(PLAN, ["slm", "llm"], None, visible=1)
    assert problem is not None
    assert "model 'llm' asks for 2 GPUs (0, 1)" in problem and "this machine has 1 GPU(s)" in problem


def test_a_single_gpu_beyond_the_machine():
    plan = {"models": {"slm": {"gpus": [3]}}}
    assert "asks for GPU 3, but this machine has 2 GPU(s) (0..1)" in gpu_count_problem(plan, ["slm"], None, 2)


def test_enough_gpus_cpu_and_remote_models_pass():
    assert gpu_count_problem(PLAN, ["slm", "llm"], None, visible=2) is None
    assert gpu_count_problem(PLAN, ["slm", "llm"], "cpu", visible=1) is None
    assert gpu_count_problem(PLAN, ["slm"], None, visible=1) is None  # llm served from another host
