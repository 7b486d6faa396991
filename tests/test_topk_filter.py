"""Top-k by the threshold filter (kernels/topk/topk_filter.py): a block streams its row or piece,
keeps the values that beat its k-th best so far, and compacts them by radix select.

On the simulator the rows are a few chunks long, so the buffer fills and compacts more
than once (an ascending row makes every value a candidate: a compaction after every
chunk); the ties, −inf/NaN rows and dtypes are those of the radix split's tests.
"""

import numpy as np
import pytest

from numba_softmax.kernels.topk import topk as K

from _helpers import sized
from test_topk import dtype_rows, radix_rows, run, run_dtype


def plan(threads, splits, vpt=4):
    return K.Plan(False, threads, vpt, splits, filter=True)


@pytest.mark.parametrize("k, threads, splits", [(1, 32, 1), (7, 64, 3), (40, 32, 1), (128, 32, 2)])
def test_filter_special_rows_and_ties(k, threads, splits):
    rng = np.random.default_rng(k)
    V = sized(300, 30_000)  # several chunks; ragged last chunk; split pieces shorter than k
    run(radix_rows(V, rng), k, plan=plan(sized(threads, 256), sized(splits, 4 * splits)))


@pytest.mark.parametrize("splits", [1, 2])
def test_filter_adversarial_orders(splits):
    """Ascending rows: every value beats θ, so the buffer compacts after every chunk;
    descending: nothing after the first chunks; a row with its winners at the end."""
    V = sized(700, 100_000)
    up = np.arange(V, dtype=np.float64) / V
    late = np.random.default_rng(3).standard_normal(V)
    late[-20:] += 10  # the 20 best in the last chunk
    x = np.stack([up, up[::-1], late, np.round(up * 7)])  # and long runs of ties
    run(x, 20, plan=plan(sized(32, 256), sized(splits, 6 * splits)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_filter_dtypes_log_temperature(dtype):
    vpt = 8 if dtype in ("float16", "bfloat16") else 4
    run_dtype(dtype_rows(sized(400, 70_000), 9), dtype, plan(sized(32, 256), sized(2, 5), vpt))


def test_filter_strided_and_k_equal_to_v():
    rng = np.random.default_rng(4)
    run(rng.standard_normal((2, sized(150, 9000))), 9, strided=True, plan=plan(32, 1))
    run(rng.standard_normal((2, 50)), 50, plan=plan(32, 1))  # every value is a winner


def test_filter_refuses_a_plan_its_buffer_cannot_hold():
    rng = np.random.default_rng(5)
    with pytest.raises(ValueError, match="overflows"):
        run(rng.standard_normal((1, 5000)), 3, plan=plan(512, 1, 16))


def test_choose_leaves_the_filter_to_plans_that_ask():
    """The lists with the floor and the buffer measured at least as fast at B 64–256 (H200):
    the default never takes the filter; the rows it took before get the lists."""
    limits = K.launcher.device_limits()
    f32 = np.dtype(np.float32)
    for rows in (1, 2, max(2, limits.sms // 4), limits.sms, 2 * limits.sms, 8 * limits.sms):
        for k in (8, 50):
            for radix in (False, True):
                assert not K.choose(rows, 128256, k, f32, 4, limits, radix).filter
    rng = np.random.default_rng(6)
    run(rng.standard_normal((limits.sms, sized(2100, 128256))), 50)  # a block per row
    run(rng.standard_normal((2, sized(2100, 128256))), 50)  # (simulator: lists in 2 pieces)
