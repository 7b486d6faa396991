"""The public softmax API: ``softmax``, ``log_softmax``, ``logsumexp`` on any array kind.

Each call: validate → see the input as rows (:mod:`._arrays`) → pick a kernel → launch
→ hand the result back as the kind of array that came in.  The kernels never see
anything but a (rows, n) device array.
"""

import functools

from numba import cuda

from . import _arrays, _fastpath
from .kernels import fused, online, split, three_pass
from .kernels.epilogue import MODES

METHODS = ("auto", "three_pass", "fused", "online", "split")
FUSED_UP_TO = 8192  # longest row ``auto`` gives the fused kernel (measured; see choose)


@functools.cache
def device_limits():
    """(largest block, multiprocessors), read once; small blocks on the simulator (one
    Python thread per CUDA thread).  Only launch heuristics depend on them."""
    if _arrays._is_simulator():
        return 32, 4
    return 1024, cuda.get_current_device().MULTIPROCESSOR_COUNT


def choose(method, rows, n, max_threads, num_sms):
    """The kernel ``auto`` picks for a (rows, n) problem.

    From the benchmark (docs/benchmarks, H200): the fused kernel wins while a row is at
    most 8192 values (one read, one write); beyond that the two-pass online kernel wins
    even though fused would still fit (its blocks grow and fewer fit on a
    multiprocessor); split-row wins only when there are too few rows to give every
    multiprocessor a block of its own.
    """
    if method != "auto":
        return method
    if n <= min(FUSED_UP_TO, fused.max_row(max_threads)):
        return "fused"
    return "split" if rows < num_sms // 2 else "online"


def launch_rows(method, mode, x, y, stream, max_threads, num_sms):
    """Run one method's kernel(s) on (rows, n) device arrays with the API's launch
    configuration — what :func:`softmax` times, minus the array handling (the benchmark's
    kernel-level entry)."""
    if method == "fused":
        fused.launch(x, y, mode, stream=stream, max_threads=max_threads,
                     rows_per_block=max(1, min(4, max_threads // 32)))
    elif method == "online":
        online.launch(x, y, mode, threads=max_threads, stream=stream)
    elif method == "split":
        split.launch(x, y, mode, threads=min(256, max_threads), stream=stream, num_sms=num_sms)
    else:
        three_pass.launch(x, y, mode, threads=min(256, max_threads), stream=stream)


def _run(mode_name, x, axis, method, out, stream):
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}; got {method!r}")
    mode = MODES[mode_name]
    keep_axis = mode_name != "logsumexp"
    stream = _arrays.as_stream(stream)
    plan_key = None
    if out is None and not _arrays._is_simulator():  # a repeat call replays its launch plan
        plan_key = _fastpath.key(x, _arrays.kind_of(x), axis, method, mode, stream)
        result = _fastpath.replay(plan_key, x)
        if result is not None:
            return result
    rows = _arrays.Rows(x, axis, stream)
    n_out = rows.n if keep_axis else 1
    target = _arrays.Out(out, rows, keep_axis) if out is not None else None  # checked first

    if rows.view is None:  # an empty axis or no rows: nothing to launch
        return _arrays.empty_result(rows, keep_axis, target)

    y_dev, y_user = target.rows_buffer() if target is not None else (None, None)
    direct = y_dev is not None  # the kernel writes straight into out
    if not direct:
        y_dev, y_user = rows.empty_like_rows(n_out)
    max_threads, num_sms = device_limits()
    chosen = choose(method, rows.rows, rows.n, max_threads, num_sms)
    with _fastpath.recording() as launches:
        launch_rows(chosen, mode, rows.view, y_dev, stream, max_threads, num_sms)
    if plan_key is not None and not direct:
        _fastpath.store(plan_key, launches, rows, y_dev, y_user, keep_axis, stream)
    if direct:
        return target.out
    result = rows.finish(y_user, keep_axis)
    return target.fill(result) if target is not None else result


def softmax(x, axis=-1, *, method="auto", out=None, stream=None):
    """Softmax along ``axis``: exp(x − m) / ℓ with the row's (m, ℓ).

    Parameters
    ----------
    x : NumPy array, or a CUDA array (CuPy, PyTorch CUDA tensor, Numba device array)
        float16 (accumulated in float32), float32 or float64; any shape and strides.
        NumPy inputs are computed on the GPU and returned as NumPy; CUDA arrays are
        returned as the same kind on the same device.  ``x`` is never modified.
    axis : int
        The axis to normalise over (negative counts from the end).
    method : {"auto", "three_pass", "fused", "online", "split"}
        Which kernel; ``"auto"`` picks by shape (``fused`` for rows of up to 8192 values,
        ``split`` for few long rows, ``online`` otherwise).
    out : array, optional
        Where to write the result: same kind, shape and dtype as the result.  It may be
        ``x`` itself (in place).
    stream : Numba stream, CuPy/PyTorch stream, or int handle, optional
        The CUDA stream to run on; default: the legacy default stream, which orders
        the call after work already queued by CuPy and PyTorch on *their* defaults.
        Pass ``torch.cuda.current_stream()`` or ``cupy.cuda.get_current_stream()`` when
        you work on another stream.

    Semantics follow ``torch.softmax``: −inf entries give 0; a row of all −inf gives a
    NaN row; a NaN or +inf in a row gives a NaN row; a zero-length axis gives an empty
    result.
    """
    return _run("softmax", x, axis, method, out, stream)


def log_softmax(x, axis=-1, *, method="auto", out=None, stream=None):
    """log softmax along ``axis``: (x − m) − log ℓ.  Arguments as :func:`softmax`."""
    return _run("log_softmax", x, axis, method, out, stream)


def logsumexp(x, axis=-1, *, method="auto", out=None, stream=None):
    """log Σ exp(x) along ``axis`` = m + log ℓ; the result drops ``axis``.

    −inf for an empty axis or a row of all −inf, +inf for a row holding +inf, NaN for a
    row holding NaN.  Arguments as :func:`softmax`.
    """
    return _run("logsumexp", x, axis, method, out, stream)
