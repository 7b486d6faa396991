"""Ring attention, one step's arithmetic: attention with LSE on the keys in hand, merged.

Whatever carries the K/V shards round the ring (a Python list, or torch.distributed), a
rank's step is the same two calls, made by :func:`fold`::

    O_t, LSE_t = attention(Q[q rows], K[k rows], V[k rows], causal, scale)   (partial result)
    O, LSE     = update_out_and_lse(O, LSE, O_t, LSE_t)                     (the combiner)

Who does the arithmetic is a *compute hook*, so one transport serves every array kind:

``DeviceCompute``     :func:`numba_softmax.attention` (``return_lse=True``) and
                      :func:`numba_softmax.merge_attention` — NumPy arrays (on the GPU or
                      the CUDA simulator), CuPy arrays, torch CUDA tensors (give it the
                      torch stream: the Numba kernels then run on it, in order with NCCL);
``HostCompute``       torch CPU tensors seen as NumPy around ``DeviceCompute`` (the
                      ``gloo`` test on a machine without a GPU);
``ReferenceCompute``  float64 NumPy: :func:`numba_softmax.reference.attention` and
                      :func:`numba_softmax.reference.update_out_and_lse`.

The running O is kept in float32 whatever the input dtype (the anchor keeps it in float32
too): every partial O comes out of the kernel in the input dtype and is widened before the
merge, so P merges add no float16 rounding; the result is rounded once, at the end.
"""

import numpy as np

from .. import reference
from ..arrays import ops
from ..attention import attention as _attention
from ..attention import merge_attention as _merge

__all__ = ["DeviceCompute", "HostCompute", "ReferenceCompute", "fold"]


class DeviceCompute:
    """Each step through the public API (the kernels of :mod:`numba_softmax.kernels`);
    ``stream``: where the kernels run (e.g. ``torch.cuda.current_stream()``)."""

    def __init__(self, stream=None):
        self.stream = stream

    def attention(self, q, k, v, causal, scale):
        return _attention(q, k, v, causal=causal, scale=scale, return_lse=True,
                          stream=self.stream)

    def merge(self, o, lse, o_t, lse_t):
        return _merge(o, lse, o_t, lse_t, stream=self.stream)

    def widen(self, o):
        return ops.cast(o, np.float32)

    def finish(self, o, like):
        return ops.cast(o, like)


class HostCompute(DeviceCompute):
    """torch CPU tensors in and out, NumPy arrays to the kernels (bfloat16 as its uint16
    bits, the package's convention)."""

    @staticmethod
    def _numpy(x):
        import torch

        if x.dtype == torch.bfloat16:
            return x.contiguous().view(torch.uint16).numpy()
        return x.detach().numpy()

    @staticmethod
    def _torch(a):
        import torch

        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.view(torch.bfloat16) if a.dtype == np.uint16 else t

    def attention(self, q, k, v, causal, scale):
        o, lse = super().attention(*map(self._numpy, (q, k, v)), causal, scale)
        return self._torch(o), self._torch(lse)

    def merge(self, o, lse, o_t, lse_t):
        return tuple(map(self._torch, super().merge(*map(self._numpy, (o, lse, o_t, lse_t)))))


class ReferenceCompute:
    """float64 NumPy, the oracle: the ring with exact-as-can-be arithmetic."""

    def attention(self, q, k, v, causal, scale):
        return reference.attention(q, k, v, causal=causal, scale=scale, return_lse=True)

    def merge(self, o, lse, o_t, lse_t):
        return reference.update_out_and_lse(o, lse, o_t, lse_t)

    def widen(self, o):
        return ops.cast(o, np.float64)

    def finish(self, o, like):
        return ops.cast(o, like)


def _noop(phase, st, arrays):
    pass


def fold(state, st, q, k, v, scale, compute, hook=None):
    """Rank ``st.rank``'s step ``st``: its query rows ``st.q`` against rows ``st.k`` of the
    K/V shard in hand, merged into ``state`` = (O, LSE) (None before the first step, which
    always covers every query row).  Returns the new state.

    ``hook(phase, st, arrays)``, if given, is called with ``"computed"`` and the partial
    (O_t, LSE_t), then ``"merged"`` and the running (O, LSE) — for timing (CUDA events) or
    for showing the fold; copy what you keep: the running arrays are updated in place.
    """
    hook = hook or _noop
    if st.kind == "none":
        return state
    # the partial result of this step: attention with LSE on the keys in hand
    o_t, lse_t = compute.attention(q[..., st.q, :], k[..., st.k, :], v[..., st.k, :],
                                   st.causal, scale)
    o_t = compute.widen(o_t)
    hook("computed", st, (o_t, lse_t))
    rows = q.shape[-2]
    if state is None:
        if st.q != slice(0, rows):
            raise RuntimeError(f"step {st} is a rank's first step but misses query rows")
        o, lse = o_t, lse_t
    elif st.q == slice(0, rows):
        # O, LSE = update_out_and_lse(O, LSE, O_t, LSE_t): the combiner
        o, lse = compute.merge(*state, o_t, lse_t)
    else:
        # only some query rows met these keys: merge those rows, in place
        o, lse = state
        o_m, lse_m = compute.merge(o[..., st.q, :], lse[..., st.q], o_t, lse_t)
        o[..., st.q, :] = o_m
        lse[..., st.q] = lse_m
    hook("merged", st, (o, lse))
    return o, lse
