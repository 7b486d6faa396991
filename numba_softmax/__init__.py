"""numba_softmax: reference-and-teaching CUDA kernels for softmax and attention.

Everything here folds one monoid, the online-softmax state (m, ℓ) — see
:mod:`numba_softmax.combine`.
"""

from numba.cuda.core import config as _cuda_config

if _cuda_config.ENABLE_CUDASIM:  # the simulator lacks warp shuffles: supply them
    from . import _sim

    _sim.install()

from .combine import combine  # noqa: E402
from .softmax import log_softmax, logsumexp, softmax  # noqa: E402

__version__ = "0.1.0"
__all__ = ["combine", "softmax", "log_softmax", "logsumexp"]
