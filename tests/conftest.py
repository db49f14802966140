"""Suite-wide settings: one thread everywhere unless a test is about threads."""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# CUDA kernels run under Numba's simulator unless DK_CUDA_REAL=1 asks for a real GPU; this must
# be set before anything imports numba.cuda.
if not os.environ.get("DK_CUDA_REAL"):
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover - torch is a hard dependency
    pass

import random

import numpy as np
import pytest
from hypothesis import settings

# Every random generator in the suite is seeded: hypothesis draws the same examples on every
# run, and the global generators (random, numpy's legacy one, torch's default, used for
# example by torch.nn layer initialisation) restart from fixed seeds before each test.
settings.register_profile("dk", derandomize=True)
settings.load_profile("dk")


@pytest.fixture(autouse=True)
def _seed_global_generators() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
