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
