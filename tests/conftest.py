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


# On a GPU, NUMBA_SOFTMAX_TEST_AS=a100 or =ada runs the tests with the launch limits of an
# older GPU (its shared memory a block, its compute capability; the multiprocessors as
# few): the kernels then take the tiles and instructions they would take there — a
# Hopper standing in for GPUs the project has no access to (docs/caveats.md).
EMULATED = {  # (name, multiprocessors, shared memory a block (opt-in), a multiprocessor, L2, cc)
    "a100": ("A100 limits (emulated)", 108, 163 * 1024, 164 * 1024, 40 << 20, (8, 0)),
    "ada": ("RTX 4090 limits (emulated)", 128, 99 * 1024, 100 * 1024, 72 << 20, (8, 9)),
}
TEST_AS = os.environ.get("NUMBA_SOFTMAX_TEST_AS", "")


def _emulate(which):
    from numba_softmax.runtime import launcher

    name, sms, optin, per_sm, l2, cc = EMULATED[which]
    real = launcher.device_limits()
    if sms > real.sms or optin > real.shared_optin:
        raise pytest.UsageError(f"NUMBA_SOFTMAX_TEST_AS={which}: this GPU ({real.name}) is smaller")
    fake = real._replace(name=name, sms=sms, shared_optin=optin, shared_per_sm=per_sm,
                         l2_bytes=l2, cc=cc)
    launcher.device_limits = lambda: fake


def pytest_configure(config):
    if SIMULATOR:
        _shuffle_blocks()
    if TEST_AS:
        if SIMULATOR or TEST_AS not in EMULATED:
            raise pytest.UsageError(f"NUMBA_SOFTMAX_TEST_AS={TEST_AS!r}: one of {sorted(EMULATED)}, "
                                    f"on a GPU")
        _emulate(TEST_AS)


def pytest_report_header(config):
    order = BLOCK_ORDER if BLOCK_ORDER in ("in order", "reverse") else f"shuffled, seed {BLOCK_ORDER}"
    where = f"the CUDA simulator (blocks {order})" if SIMULATOR else "the GPU"
    return f"numba_softmax tests on {where}" + (f", as {EMULATED[TEST_AS][0]}" if TEST_AS else "")


@pytest.fixture
def four_warp_blocks(monkeypatch):
    """Blocks of up to 128 threads on the simulator, whose launch limit is 64 (two warps):
    for a path only blocks of more than two warps take (the top-k lists' shared floor).
    Nothing changes on a GPU.  Returns ``allow(launcher)``, the same for another copy of
    the package's launcher module (``scripts/gpu/topk_ablate.py``'s variants)."""

    def allow(launcher):
        if SIMULATOR:
            monkeypatch.setattr(launcher, "max_threads", lambda kernel, args: 4 * 32)

    from numba_softmax.runtime import launcher

    allow(launcher)
    return allow
