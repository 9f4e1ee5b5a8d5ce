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
