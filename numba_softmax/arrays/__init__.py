"""The array layer: the one place that knows NumPy, CuPy, PyTorch and Numba arrays.

* :mod:`.kinds`  — library detection and description: kind, dtype, strides, pointer, and
  device views over an array's memory;
* :mod:`.ops`    — the per-library operations: new arrays, results, casts, streams;
* :mod:`.plan_facts` — what a launch plan's look-up reads of an array, fast (every
  library branch of the package is in these three modules);
* :mod:`.layout` — stride arithmetic: which views fold, and the device copy when not;
* :mod:`.rows`   — reductions along an axis: (rows, n) views, ``out=``, results;
* :mod:`.heads`  — attention's (B, H, S, D) views;
* :mod:`.pool`   — device memory for Numba-array results, reused (as PyTorch's and
  CuPy's allocators reuse theirs).

It stands on :mod:`numba_softmax.runtime` (the device copy, the driver, what a recorded call
allocates) and never imports the kernels.
"""

from . import heads, kinds, layout, ops, plan_facts, pool, rows  # noqa: F401
