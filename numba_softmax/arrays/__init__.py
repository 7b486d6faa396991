"""The array layer: the one place that knows NumPy, CuPy, PyTorch and Numba arrays.

* :mod:`.kinds`  — library detection and the per-library operations (views, new arrays,
  results, streams); every library branch of the package is there;
* :mod:`.layout` — stride arithmetic: which views fold, and the device copy when not;
* :mod:`.rows`   — reductions along an axis: (rows, n) views, ``out=``, results;
* :mod:`.heads`  — attention's (B, H, S, D) views;
* :mod:`.pool`   — device memory for Numba-array results, reused (as PyTorch's and
  CuPy's allocators reuse theirs).

It stands on :mod:`numba_softmax.runtime` (the device copy, the driver, what a recorded call
allocates) and never imports the kernels.
"""

from . import heads, kinds, layout, pool, rows  # noqa: F401
