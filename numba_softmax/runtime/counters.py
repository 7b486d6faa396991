"""Device memory the attention kernels keep from call to call — launcher workspaces, so
launch plans may point at them: zeroed ticket counters, and placeholders for arguments a
variant ignores.

The decode kernel's in-kernel merge (:mod:`.kernels.decode.decode`) counts finished blocks per K/V head
with an atomic ticket; the counters must be zero before a launch, so they are zeroed when
allocated and the last block of each group resets its own — they are zero between
launches.  One set per stream: two streams running at once must not share them.
(The float32 partials are :func:`.launcher.scratch` workspaces.)
"""

import numpy as np

from . import launcher


def tickets(n, stream=0, name="tickets"):
    """At least n int32 counters, all zero (a zeroed :func:`.launcher.workspace`); each
    ``name`` its own set, so that one kernel's launch cut short (counters left non-zero)
    cannot make another kernel's merge skip."""
    return launcher.workspace(name, max(n, 1024), np.int32, stream, zeroed=True)


def placeholder(ndim, dtype):
    """A tiny array standing in for an argument a kernel variant does not read."""
    return launcher.workspace(f"placeholder {np.dtype(dtype)}", 1, dtype, 0)[:1].reshape((1,) * ndim)
