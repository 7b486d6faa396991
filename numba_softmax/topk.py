"""The public top-k API: ``softmax_topk`` and ``sample`` on any array kind.

Each call: a launch plan? replay it — else validate → see the input as rows
(:class:`.arrays.rows.Rows`) → launch
(:mod:`.kernels.topk.topk`, :mod:`.kernels.topk.sample`) → give the results back as the kind of
array that came in (NumPy in → NumPy out; CuPy, PyTorch CUDA tensors and Numba device
arrays → the same kind, on the same device).  Inputs are never modified.
"""

import numpy as np

from . import checks, plans
from .arrays import ops
from .arrays.rows import Finish, Rows
from .kernels.topk import sample as _sample
from .kernels.topk import topk as _topk

__all__ = ["softmax_topk", "sample"]


def softmax_topk(x, k, axis=-1, *, temperature=1.0, log=False, stream=None):
    """The k largest probabilities of softmax(x / temperature) along ``axis``, and where.

    Returns ``(values, indices)``, both with the k axis in place of ``axis``: values sorted
    descending, in x's dtype (probabilities — or log-probabilities with ``log=True``);
    indices int64.  One read of ``x`` (Milakov & Gimelshein's fused softmax + top-k).
    Same as ``torch.topk(torch.softmax(x / T, axis), k, axis)``; equal values go to the
    lower index; a row holding NaN or +inf, or of all −inf, has no softmax (torch: NaN
    everywhere) and gives NaN values at indices 0 … k − 1.

    x: NumPy array or CUDA array (CuPy, PyTorch, Numba), float16, float32 or float64, any
    shape and strides.  k: 1 … min(length of ``axis``, 128).  temperature: finite, > 0.
    stream: as for :func:`numba_softmax.softmax`.
    """
    stream = ops.as_stream(stream)
    plan_key, plan, ptrs = plans.lookup(("softmax_topk", k, axis, temperature, log), (x, None),
                                        stream)
    if plan is not None:
        return plan((x, None), stream, ptrs)
    temperature = checks.temperature(temperature)
    if not isinstance(log, (bool, np.bool_)):
        raise TypeError(f"log must be a bool, got {type(log).__name__}")
    rows = Rows(x, axis, facts=plans.seen(plan_key, ptrs, 1)[0])
    k = checks.top_k(k, rows.n, "k")
    fin_v, fin_i = Finish(rows, True, n_out=k), Finish(rows, True, n_out=k, dtype=np.dtype(np.int64))
    if rows.rows == 0:  # no rows: nothing to launch
        shape = rows.lead_shape[: rows.axis] + (k,) + rows.lead_shape[rows.axis:]
        return (ops.full(rows.kind, shape, 0, rows.dtype, like=x),
                ops.full(rows.kind, shape, 0, np.dtype(np.int64), like=x))
    with plans.Recorder(plan_key, (x, None), stream, (rows.d, None)) as rec:
        view = rows.view(stream)
        v_buf, values = ops.empty(rows.kind, (rows.rows, k), rows.dtype, like=x, stream=stream)
        i_buf, indices = ops.empty(rows.kind, (rows.rows, k), np.dtype(np.int64), like=x,
                                   stream=stream)
        _topk.launch(view, k, values, indices, temperature=temperature, log=bool(log),
                     stream=stream)
        return rec.done(_Pair(fin_v, fin_i), v_buf, i_buf)


class _Pair:
    """(values, indices) in the user's kind and layout from the two new buffers."""

    def __init__(self, fin_v, fin_i):
        self.fin_v, self.fin_i = fin_v, fin_i

    def __call__(self, v_buf, i_buf, out=None, stream=0):
        return self.fin_v(v_buf, stream=stream), self.fin_i(i_buf, stream=stream)


def sample(logits, *, top_k=None, top_p=1.0, temperature=1.0, seed=0, axis=-1, stream=None):
    """One token per row, drawn from softmax(logits / temperature) cut to its ``top_k``
    most probable tokens (renormalised), then to the smallest prefix of those whose mass is
    ≥ ``top_p``.  Returns int64 tokens with ``axis`` removed; −1 for a row with no softmax
    (NaN, +inf, all −inf).

    ``top_k=None``: the whole vocabulary, drawn in one pass by the Gumbel-max trick; then
    ``top_p`` must be 1.  The draws are a function of (seed, row) alone — rows counted in C
    order over the other axes — on any device and in the NumPy twin
    :func:`numba_softmax.reference.topk.sample` (up to float rounding at a boundary).

    top_k: None or 1 … min(length of ``axis``, 128).  top_p: 0 < p ≤ 1.  temperature:
    finite, > 0.  seed: any integer (taken mod 2**64).
    """
    stream = ops.as_stream(stream)
    plan_key, plan, ptrs = plans.lookup(("sample", top_k, top_p, temperature, seed, axis),
                                        (logits, None), stream)
    if plan is not None:
        return plan((logits, None), stream, ptrs)
    temperature = checks.temperature(temperature)
    top_p = checks.top_p(top_p)
    seed = checks.integer(seed, "seed")
    rows = Rows(logits, axis, "logits", facts=plans.seen(plan_key, ptrs, 1)[0])
    if rows.n == 0:
        raise ValueError("logits: the axis to sample along is empty")
    if top_k is not None:
        top_k = checks.top_k(top_k, rows.n, "top_k")
    elif top_p < 1:
        raise ValueError("top_p < 1 needs top_k (≤ 128): the nucleus is cut from the sorted "
                         "top-k list")
    finish = Finish(rows, False, n_out=1, dtype=np.dtype(np.int64))
    if rows.rows == 0:  # no rows
        return ops.full(rows.kind, rows.lead_shape, 0, np.dtype(np.int64), like=logits)
    with plans.Recorder(plan_key, (logits, None), stream, (rows.d, None)) as rec:
        view = rows.view(stream)
        buf, tokens = ops.empty(rows.kind, (rows.rows, 1), np.dtype(np.int64), like=logits,
                                stream=stream)
        _sample.launch(view, tokens.reshape(rows.rows), top_k=top_k, top_p=top_p,
                       temperature=temperature, seed=seed, stream=stream)
        return rec.done(finish, buf)
