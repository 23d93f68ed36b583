"""The launcher's device facts come from the driver API (`cuda_info`), without torch: checked against a fake
libcuda that answers as the real one does, and without any driver (this machine)."""

from __future__ import annotations

import ctypes

import pytest

from tokenrouter.runtime import cuda_info


class FakeDriver:
    def __init__(self, totals, init_rc=0, fail_at=None):
        self.totals, self.init_rc, self.fail_at = totals, init_rc, fail_at

    def cuInit(self, flags):
        return self.init_rc

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.totals)
        return 0

    def cuDeviceGet(self, dev, i):
        dev._obj.value = i
        return 0

    def cuDeviceTotalMem_v2(self, size, dev):
        if dev.value == self.fail_at:
            return 101  # CUDA_ERROR_INVALID_DEVICE
        size._obj.value = self.totals[dev.value]
        return 0


@pytest.fixture
def driver(monkeypatch):
    def use(fake):
        monkeypatch.setattr(cuda_info, "_driver", lambda: fake)
        cuda_info.device_memory.cache_clear()

    yield use
    cuda_info.device_memory.cache_clear()


def test_totals_per_device_in_cuda_order(driver):
    driver(FakeDriver([80 << 30, 141 << 30]))
    assert cuda_info.device_memory() == (80 << 30, 141 << 30)
    assert cuda_info.device_count() == 2


@pytest.mark.parametrize(
    "fake", [None, FakeDriver([80 << 30], init_rc=100), FakeDriver([80 << 30, 1], fail_at=1)]
)
def test_no_driver_or_a_failing_one_means_no_device(driver, fake):
    driver(fake)  # no libcuda; cuInit's CUDA_ERROR_NO_DEVICE; a device the driver cannot size
    assert cuda_info.device_memory() == ()
    assert cuda_info.device_count() == 0


def test_serve_sizing_and_device_checks_read_the_driver(driver):
    from tokenrouter.runtime.launch_checks import LaunchError, check_device
    from tokenrouter.runtime.memory_share import cuda_totals
    from tokenrouter.runtime.subserver.loading import gpu_count_problem

    plan = {"models": {"llm": {"gpus": [1]}}}
    driver(FakeDriver([80 << 30]))
    assert cuda_totals() == {0: 80 << 30}
    check_device("cuda")
    assert "this machine has 1 GPU(s)" in gpu_count_problem(plan, ["llm"], None)
    driver(None)
    assert cuda_totals() is None
    assert gpu_count_problem(plan, ["llm"], None) is None  # no GPU: the models run on the CPU
    with pytest.raises(LaunchError, match="no CUDA device is available"):
        check_device("cuda")


def test_the_real_library_loads_or_is_absent():
    lib = cuda_info._driver()
    assert lib is None or isinstance(lib, ctypes.CDLL)


def test_serve_device_cuda_requires_torch_cuda_in_the_subserver(monkeypatch):
    """The launcher asks only the driver, so `--device cuda` tells each subserver to require CUDA of torch: a
    torch without it is a clear error there, not a silent fall back to the CPU."""
    import torch

    from tokenrouter.runtime.modes import ModeSetup
    from tokenrouter.runtime.process_args import subserver_args
    from tokenrouter.runtime.serve_config import ServeConfig
    from tokenrouter.runtime.subserver.loading import pick_device

    eps = {"launcher": "ipc://a", "frontend": "ipc://b", "subservers": {"slm": "ipc://c"}}
    setup = ModeSetup(mode="tokenrouter", plan={})
    for device, (override, required) in {
        "cuda": (None, True),
        "cpu": ("cpu", False),
        None: (None, False),
    }.items():
        args = subserver_args(ServeConfig(plan="x.plan", device=device), setup, "slm", "x.plan", eps, None)
        assert (args.device, args.require_cuda) == (override, required)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--device cuda: torch .* cannot use CUDA.*use --device cpu"):
        pick_device({"gpus": [0]}, None, require_cuda=True)
    assert pick_device({"gpus": [0]}) == "cpu"  # the plan's placement without --device: CPU where no CUDA
