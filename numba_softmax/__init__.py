"""numba_softmax: reference-and-teaching CUDA kernels for softmax and attention.

Everything here folds one monoid, the online-softmax state (m, ℓ) — see
:mod:`numba_softmax.combine`.
"""

import os as _os

from numba.cuda.core import config as _cuda_config

if _cuda_config.ENABLE_CUDASIM:  # the simulator lacks warp shuffles: supply them
    from .runtime import sim as _sim

    _sim.install()

# Numba warns on every launch of fewer than 128 blocks; a library call on a small input
# is such a launch, and building the warning costs more than the kernel.  Keep the user's
# explicit choice (the environment variable) if there is one.
if "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" not in _os.environ:
    _cuda_config.CUDA_LOW_OCCUPANCY_WARNINGS = 0

from . import combine as _combine  # noqa: E402
from . import errors as _errors  # noqa: E402
from .attention import attention, merge_attention  # noqa: E402
from .inference import append_kv, attention_varlen, paged_attention  # noqa: E402
from .backward import attention_backward, log_softmax_backward, softmax_backward  # noqa: E402
from .ring import ring_attention  # noqa: E402  (imports torch only when called)
from .softmax import log_softmax, logsumexp, softmax  # noqa: E402
from .topk import sample, softmax_topk  # noqa: E402


def combine(m_a, l_a, m_b, l_b):
    """Merge two (m, ℓ) states into the state of their union (:mod:`numba_softmax.combine`).

    Scalars give ``(m, l)`` floats; NumPy arrays (or anything array-like) are merged
    elementwise, with broadcasting, by the vectorised twin.

    >>> combine(0.0, 1.0, 1.0, 1.0)   # the states of [0] and [1] → the state of [0, 1]
    (1.0, 1.3678794411714423)
    """
    if all(isinstance(v, (int, float)) for v in (m_a, l_a, m_b, l_b)):
        return _combine.combine(m_a, l_a, m_b, l_b)
    return _combine.combine_np(m_a, l_a, m_b, l_b)


softmax = _errors.public(softmax)
log_softmax = _errors.public(log_softmax)
logsumexp = _errors.public(logsumexp)
attention = _errors.public(attention)
merge_attention = _errors.public(merge_attention)
softmax_backward = _errors.public(softmax_backward)
log_softmax_backward = _errors.public(log_softmax_backward)
attention_backward = _errors.public(attention_backward)
softmax_topk = _errors.public(softmax_topk)
sample = _errors.public(sample)
attention_varlen = _errors.public(attention_varlen)
paged_attention = _errors.public(paged_attention)
append_kv = _errors.public(append_kv)

__version__ = "0.1.0"
__all__ = ["combine", "softmax", "log_softmax", "logsumexp", "attention", "merge_attention",
           "softmax_backward", "log_softmax_backward", "attention_backward", "ring_attention", "softmax_topk", "sample",
           "attention_varlen", "paged_attention", "append_kv"]
