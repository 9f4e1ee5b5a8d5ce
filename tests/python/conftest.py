import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import torch

    _gpu = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
except ImportError:
    _gpu = False

requires_gpu = pytest.mark.skipif(not _gpu, reason="needs an sm_90a CUDA GPU (H100/H200)")


def zero_fills_during(fn):
    """(dtype, shape) of every zero-filled tensor that aten creates while fn() runs: autograd
    materialises an unused output's gradient that way, which costs a fill of the output's size."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.fills = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func)
            if isinstance(out, torch.Tensor) and ("zero" in name or "fill" in name):
                self.fills.append((out.dtype, tuple(out.shape)))
            return out

    with Log() as log:
        fn()
    return log.fills


# A run in which every test was skipped (no PyTorch, say) proves nothing: it fails.
_passed = [0]


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        _passed[0] += 1


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0 and _passed[0] == 0:
        print(
            "\nerror: no test ran (every one was skipped or deselected); see the skip reasons above"
        )
        session.exitstatus = 1
