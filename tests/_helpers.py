"""Shared test helpers: the run mode and sizes scaled to it."""

import os

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def sized(sim, gpu):
    """``sim`` on the simulator (tiny: one Python thread per CUDA thread), else ``gpu``."""
    return sim if SIMULATOR else gpu


def device_kinds():
    """The CUDA array kinds to test: Numba always; PyTorch and CuPy on a GPU when installed."""
    kinds = ["numba"]
    if SIMULATOR:
        return kinds
    try:
        import torch

        if torch.cuda.is_available():
            kinds.append("torch")
    except ImportError:
        pass
    try:
        import cupy  # noqa: F401

        kinds.append("cupy")
    except ImportError:
        pass
    return kinds
