"""Test set-up, decided before numba is imported.

* Where no GPU is usable, run on the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``); an
  explicit ``NUMBA_ENABLE_CUDASIM`` from the user always wins.  The probe asks the CUDA
  driver directly (ctypes), so numba is not imported before the choice is made.
* Hypothesis profiles: ``sim`` (few, small examples: ~400 simulated threads/s),
  ``gpu`` (many, larger examples) and ``fuzz`` (the long reliability run).  The right one
  of the first two is loaded by default; ``--hypothesis-profile NAME`` overrides it.
  ``deadline=None`` everywhere: the first example of a kernel pays its JIT compilation.
"""

import ctypes
import os


def _gpu_usable():
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        return libcuda.cuInit(0) == 0 and libcuda.cuDeviceGetCount(ctypes.byref(count)) == 0 \
            and count.value > 0
    except OSError:
        return False


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _gpu_usable():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("sim", max_examples=8, **_common)
# the GPU check's suite job lowers it (NUMBA_SOFTMAX_GPU_EXAMPLES): its fuzz shards draw the many
settings.register_profile("gpu", max_examples=int(os.environ.get("NUMBA_SOFTMAX_GPU_EXAMPLES", 150)),
                          **_common)
# the GPU check runs the fuzz tests in shards of NUMBA_SOFTMAX_FUZZ_EXAMPLES cases per test
settings.register_profile("fuzz", max_examples=int(os.environ.get("NUMBA_SOFTMAX_FUZZ_EXAMPLES", 2000)),
                          **_common)
settings.load_profile("sim" if SIMULATOR else "gpu")


# A GPU runs a grid's blocks in no promised order; the simulator runs them one after
# another, first to last, so a kernel whose last block to finish does the merge (decode's
# splits, the radix top-k's pieces) would always see them finish in index order.  Here
# the simulator takes them in a shuffled order, seeded (NUMBA_SOFTMAX_SIM_BLOCKS: a seed,
# "reverse", or "in order" for the simulator's own).
BLOCK_ORDER = os.environ.get("NUMBA_SOFTMAX_SIM_BLOCKS", "0")


def _shuffle_blocks():
    import random

    import numpy
    from numba.cuda.simulator import kernel

    if BLOCK_ORDER == "in order":
        return
    rng = random.Random(None if BLOCK_ORDER == "reverse" else int(BLOCK_ORDER))

    class _Numpy:  # the simulator's kernel module's numpy, but for the grid's loop
        def __getattr__(self, name):
            return getattr(numpy, name)

        @staticmethod
        def ndindex(*shape):  # (the grid loop is its one caller there: blocks run elsewhere)
            points = list(numpy.ndindex(*shape))
            if BLOCK_ORDER == "reverse":
                points.reverse()
            else:
                rng.shuffle(points)
            return iter(points)

    kernel.np = _Numpy()


def pytest_configure(config):
    if SIMULATOR:
        _shuffle_blocks()


def pytest_report_header(config):
    order = BLOCK_ORDER if BLOCK_ORDER in ("in order", "reverse") else f"shuffled, seed {BLOCK_ORDER}"
    return f"numba_softmax tests on {f'the CUDA simulator (blocks {order})' if SIMULATOR else 'the GPU'}"


@pytest.fixture
def four_warp_blocks(monkeypatch):
    """Blocks of up to 128 threads on the simulator, whose launch limit is 64 (two warps):
    for a path only blocks of more than two warps take (the top-k lists' shared floor).
    Nothing changes on a GPU.  Returns ``allow(launcher)``, the same for another copy of
    the package's launcher module (``scripts/gpu/topk_ablate.py``'s variants)."""

    def allow(launcher):
        if SIMULATOR:
            monkeypatch.setattr(launcher, "max_threads", lambda kernel, args: 4 * 32)

    from numba_softmax.kernels import launcher

    allow(launcher)
    return allow
