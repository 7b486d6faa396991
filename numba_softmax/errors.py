"""What a user sees when no GPU is usable: one clear error, not a driver traceback."""

import functools

NO_GPU = ("numba_softmax needs a usable CUDA GPU, and none was found ({why}).  To run the "
          "same kernels slowly on the CPU, set NUMBA_ENABLE_CUDASIM=1 in the environment "
          "before importing numba_softmax; for plain NumPy results use "
          "numba_softmax.reference (e.g. numba_softmax.reference.softmax).")


def public(fn):
    """Wrap a public entry point: a missing driver or GPU becomes a RuntimeError that says
    what to do.  Free on the normal path (a try block costs nothing until it raises)."""
    from numba.cuda.cudadrv.error import CudaSupportError

    @functools.wraps(fn)
    def entry(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CudaSupportError as e:
            why = " ".join(str(e).split())[:200] or type(e).__name__
            raise RuntimeError(NO_GPU.format(why=why)) from None

    return entry
