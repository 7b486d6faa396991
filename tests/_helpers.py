"""Shared test helpers: the run mode and sizes scaled to it."""

import os

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def sized(sim, gpu):
    """``sim`` on the simulator (tiny: one Python thread per CUDA thread), else ``gpu``."""
    return sim if SIMULATOR else gpu
