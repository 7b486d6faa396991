"""The device-memory pool behind Numba-array results (GPU only: the simulator has no
device memory to pool).  A block is reused only after every array and view holding it
is gone, only on its own stream, and never after its context was reset; results made
from pooled memory are right call after call."""

import gc

import numpy as np
import pytest

import numba_softmax as ns
from numba_softmax.arrays import pool

from _helpers import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="the pool lends device memory: GPU only")


def address(a):
    return a.__cuda_array_interface__["data"][0]


@pytest.fixture(autouse=True)
def empty_pool():
    pool.release()
    yield
    pool.release()


def test_a_dropped_array_gives_its_block_to_the_next_of_its_size():
    a = pool.device_array((3, 5), np.float32)
    where = address(a)
    del a
    gc.collect()
    b = pool.device_array((5, 3), np.float32)  # the same 60 bytes
    assert address(b) == where
    c = pool.device_array((3, 5), np.float32)  # b still holds it: another block
    assert address(c) != where


def test_a_view_keeps_the_block_from_reuse():
    a = pool.device_array((4, 8), np.float32)
    where = address(a)
    views = [a[1:3], a.reshape(8, 4), a.T]
    del a
    gc.collect()
    b = pool.device_array((4, 8), np.float32)
    assert address(b) != where
    del views
    gc.collect()
    assert address(pool.device_array((4, 8), np.float32)) == where


def test_blocks_stay_on_their_stream():
    from numba import cuda

    s = cuda.stream()
    a = pool.device_array((64,), np.float32, stream=s)
    where = address(a)
    del a
    gc.collect()
    assert address(pool.device_array((64,), np.float32)) != where  # default stream
    assert address(pool.device_array((64,), np.float32, stream=s)) == where


def test_release_and_the_cap():
    a = pool.device_array((256,), np.float32)
    assert isinstance(a.gpu_data.owner, pool._Loan)
    del a
    gc.collect()
    assert pool._CACHED[0] == 1024
    pool.release()
    assert pool._CACHED[0] == 0 and not pool._IDLE
    big = pool.device_array((pool.MAX_CACHED // 4 + 1,), np.uint8)
    assert isinstance(big.gpu_data.owner, pool._Loan)
    bigger = pool.device_array((pool.MAX_CACHED + 1,), np.uint8)  # over the cap: Numba's own
    assert not isinstance(bigger.gpu_data.owner, pool._Loan)


def test_values_written_through_the_pool_and_reread():
    from numba import cuda

    h = np.arange(1000, dtype=np.float64)
    for _ in range(3):
        a = pool.device_array(h.shape, np.float64)
        a.copy_to_device(h)
        np.testing.assert_array_equal(a.copy_to_host(), h)
        del a
        gc.collect()
    cuda.synchronize()


def test_numba_results_call_after_call_from_reused_memory():
    """Results that are kept and results that are dropped, interleaved: every kept one
    still holds its own values (a block lent twice would be overwritten)."""
    from numba import cuda

    rng = np.random.default_rng(0)
    hosts = [rng.standard_normal((37, 199)).astype(np.float32) for _ in range(6)]
    kept = []
    for i, h in enumerate(hosts * 3):
        r = ns.softmax(cuda.to_device(h))
        if i % 2:
            kept.append((r, h))
        del r
        gc.collect()
    for r, h in kept:
        np.testing.assert_allclose(r.copy_to_host(), ns.reference.softmax(h.astype(np.float64)),
                                   rtol=2e-5, atol=2e-6)


def test_a_dead_block_is_never_lent():
    """A block Numba freed with its context (``cuda.close()``) raises ReferenceError when
    touched: the pool drops it and allocates anew (faked here: closing the context would
    end every other test's context too)."""
    class Dead:
        @property
        def device_pointer(self):
            raise ReferenceError("weakly-referenced object no longer exists")

    a = pool.device_array((128,), np.float32)
    where = address(a)
    del a
    gc.collect()
    key = next(iter(pool._IDLE))
    pool._IDLE[key].append((Dead(), 12345))
    pool._CACHED[0] += key[2]
    b = pool.device_array((128,), np.float32)
    assert address(b) == where  # the dead one was skipped, the live one lent
    b.copy_to_device(np.ones(128, np.float32))
    np.testing.assert_array_equal(b.copy_to_host(), np.ones(128, np.float32))
