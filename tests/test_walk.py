"""The walks of one row (docs/textbook/2-online.md, 5-flashattention.md): their numbers
come from the device kernels, and they are what the pages say they are.  Runs the walk the
docs build runs (tiny: a 16-value row and a 37-key attention row); the generator also
asserts every equation it prints."""

import math
import sys
from pathlib import Path

import numpy as np

from numba_softmax import reference as R

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "_ext"))
import walk  # noqa: E402


def test_softmax_walk_folds_to_the_row_state():
    w = walk.softmax_walk()
    x = w["x"].astype(np.float64)
    m, l = R.online_state(x, block=x.size)
    assert w["run_m"][-1] == m  # the max is exact
    assert math.isclose(w["run_l"][-1], l, rel_tol=1e-6)
    # the running state after chunk k is the state of the first k+1 chunks
    for k in range(len(w["run_m"])):
        mk, lk = R.online_state(x[: (k + 1) * walk.CHUNK], block=walk.CHUNK)
        assert w["run_m"][k] == mk and math.isclose(w["run_l"][k], lk, rel_tol=1e-6)
    # the page describes both kinds of step: a jump of the max (re-base < 1) and none
    jumps = [w["run_m"][k] > w["run_m"][k - 1] for k in range(1, len(w["run_m"]))]
    assert any(jumps) and not all(jumps)
    table = w["table"]
    assert "e^(" in table and "chunk state (m̃, ℓ̃)" in table and "(−∞, 0) ⊕" in table


def test_attention_walk_matches_the_kernel_and_the_reference():
    w = walk.attention_walk()
    np.testing.assert_allclose(w["o"], w["o_full"], atol=1e-5)
    assert "| 32–36 |" in w["table"]  # the ragged last tile is shown
    assert math.isfinite(w["lse"])
