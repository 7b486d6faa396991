"""numba_softmax: reference-and-teaching CUDA kernels for softmax and attention.

Everything here folds one monoid, the online-softmax state (m, ℓ) — see
:mod:`numba_softmax.combine`.
"""

import os as _os

from numba.cuda.core import config as _cuda_config

if _cuda_config.ENABLE_CUDASIM:  # the simulator lacks warp shuffles: supply them
    from . import _sim

    _sim.install()

# Numba warns on every launch of fewer than 128 blocks; a library call on a small input
# is such a launch, and building the warning costs more than the kernel.  Keep the user's
# explicit choice (the environment variable) if there is one.
if "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" not in _os.environ:
    _cuda_config.CUDA_LOW_OCCUPANCY_WARNINGS = 0

from .combine import combine  # noqa: E402
from .softmax import log_softmax, logsumexp, softmax  # noqa: E402
from .attention import attention, merge_attention  # noqa: E402  (the module stays importable by path)

__version__ = "0.1.0"
__all__ = ["combine", "softmax", "log_softmax", "logsumexp", "attention", "merge_attention"]
