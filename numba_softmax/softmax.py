"""The public softmax API: ``softmax``, ``log_softmax``, ``logsumexp`` on any array kind.

Each call: a launch plan? replay it (:mod:`.plans`) — else validate every argument →
see the input as rows (:mod:`.arrays.rows`) → pick a kernel and launch it
(:mod:`.kernels.softmax.methods`) → hand the result back as the kind of array that came in.
The kernels never see anything but a (rows, n) device array.
"""

from . import plans
from .arrays import ops
from .arrays.rows import Finish, Out, Rows
from .kernels.softmax import methods
from .kernels.rows.epilogue import MODES

METHODS = methods.METHODS


def _reduce(mode_name, x, axis, method, out, stream):
    stream = ops.as_stream(stream)
    plan_key, plan, ptrs = plans.lookup(("reduce", mode_name, method, axis), (x, out), stream)
    if plan is not None:  # a repeat call: replay its recorded launches
        return plan((x, out), stream, ptrs)

    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}; got {method!r}")
    keep_axis = mode_name != "logsumexp"
    seen = plans.seen(plan_key, ptrs, 2)  # what the look-up read: each array described once
    rows = Rows(x, axis, facts=seen[0])
    shape = rows.d.shape if keep_axis else (rows.lead_shape if rows.d.ndim else ())
    target = (Out(out, rows, shape, allow_in_place=keep_axis, facts=seen[1])
              if out is not None else None)
    finish = Finish(rows, keep_axis, n_out=None if keep_axis else 1)
    if rows.empty:  # an empty axis or no rows: nothing to launch
        result = ops.full(rows.kind, shape, float("-inf"), rows.dtype, like=x)
        return target.fill(result, stream) if target is not None else result

    described = (rows.d, target.d if target is not None else None)
    with plans.Recorder(plan_key, (x, out), stream, described) as rec:
        x_rows = rows.view(stream)
        n_out = rows.n if keep_axis else 1
        y = target.rows_view(rows.rows, n_out, rows.axis if keep_axis else None) if target else None
        buf = None
        if y is None:  # a new result buffer (or one copied into out= afterwards), made in
            # the result's own shape: a replay then hands it back without a reshape
            buf, y = ops.empty(rows.kind, finish.moved or (rows.rows, n_out), rows.dtype,
                               like=x, stream=stream)
            y = y.reshape(rows.rows, n_out)
        methods.launch(method, MODES[mode_name], x_rows, y, stream)
        if target is None:
            return rec.done(finish, buf)
        if buf is not None:
            target.fill(finish(buf, stream=stream), stream)
        return rec.done(_the_out, out=out)


def _the_out(out=None, stream=0):
    return out


def softmax(x, axis=-1, *, method="auto", out=None, stream=None):
    """Softmax along ``axis``: exp(x − m) / ℓ with the row's (m, ℓ).

    Parameters
    ----------
    x : NumPy array, or a CUDA array (CuPy, PyTorch CUDA tensor, Numba device array)
        float16 or bfloat16 (accumulated in float32), float32 or float64; any shape and
        strides.  NumPy inputs are computed on the GPU and returned as NumPy; CUDA arrays
        are returned as the same kind on the same device.  ``x`` is never modified.
    axis : int
        The axis to normalise over (negative counts from the end).
    method : {"auto", "three_pass", "fused", "online", "split", "onchip", "group", "cluster"}
        Which kernel (:data:`METHODS`); ``"auto"`` picks by shape and device.
    out : array, optional
        Where to write the result: same kind, shape and dtype as the result.  It may be
        ``x`` itself (in place); any other overlap of device arrays is a ``ValueError``
        (a NumPy ``x`` is copied to the device first, so an overlapping NumPy ``out``
        receives the softmax of ``x`` as it was).
    stream : Numba stream, CuPy/PyTorch stream, or int handle, optional
        The CUDA stream to run on; default: the legacy default stream, which orders
        the call after work already queued by CuPy and PyTorch on *their* defaults.
        Pass ``torch.cuda.current_stream()`` or ``cupy.cuda.get_current_stream()`` when
        you work on another stream.

    Semantics follow ``torch.softmax``: −inf entries give 0; a row of all −inf gives a
    NaN row; a NaN or +inf in a row gives a NaN row; a zero-length axis gives an empty
    result; a 0-d input gives a 0-d result.
    """
    return _reduce("softmax", x, axis, method, out, stream)


def log_softmax(x, axis=-1, *, method="auto", out=None, stream=None):
    """log softmax along ``axis``: (x − m) − log ℓ.  Arguments as :func:`softmax`."""
    return _reduce("log_softmax", x, axis, method, out, stream)


def logsumexp(x, axis=-1, *, method="auto", out=None, stream=None):
    """log Σ exp(x) along ``axis`` = m + log ℓ; the result drops ``axis``.

    −inf for an empty axis or a row of all −inf, +inf for a row holding +inf, NaN for a
    row holding NaN.  Arguments as :func:`softmax`.
    """
    return _reduce("logsumexp", x, axis, method, out, stream)
