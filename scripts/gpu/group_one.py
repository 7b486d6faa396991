"""One group-kernel launch to profile (issue 13): run under ``ncu -k regex:group``.

    ncu -k regex:group --launch-skip 2 --launch-count 1 … python scripts/gpu/group_one.py [ROWS N]

Three launches on a float32 (ROWS, N) array (default 1024 × 65536): the first
compiles, the third is the one to profile.
"""

import sys

import torch
from numba import cuda

from numba_softmax.kernels.softmax import group
from numba_softmax.kernels.rows.epilogue import SOFTMAX

rows, n = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (1024, 65536)
x = torch.randn(rows, n, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    group.launch(cuda.as_cuda_array(x), cuda.as_cuda_array(y), SOFTMAX)
torch.cuda.synchronize()
print("max error", float((y - torch.softmax(x, -1)).abs().max()))
