"""Shared test helpers: the run mode, sizes scaled to it, array kinds, scripts as modules."""

import importlib.util
import os
from pathlib import Path

import numpy as np

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
ROOT = Path(__file__).resolve().parents[1]


def load_script(relative):
    """A script of the repository (e.g. ``scripts/gpu_check.py``) imported as a module."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def permuted(arr, order):
    """A Numba device array viewed with its axes permuted (no copy; Numba's own
    ``transpose`` takes 2-D arrays only)."""
    from numba_softmax.arrays import kinds

    if list(order) == sorted(order) or arr.ndim < 2:
        return arr
    d = kinds.describe(arr)
    return kinds.view_of(d, tuple(d.shape[i] for i in order), tuple(d.strides[i] for i in order))


def heads_view(x):
    """The host array x (B, H, S, D) on the device as a model hands it over: a view of a
    (B, S, H, D) array, the rows of one head H·D values apart."""
    from numba import cuda

    return permuted(cuda.to_device(np.ascontiguousarray(x.transpose(0, 2, 1, 3))), (0, 2, 1, 3))


def to_host(y):
    """Any array kind's values as a NumPy array."""
    if isinstance(y, np.ndarray):
        return y
    if hasattr(y, "copy_to_host"):
        return y.copy_to_host()
    if type(y).__module__.startswith("torch"):
        return y.detach().cpu().numpy()
    import cupy

    return cupy.asnumpy(y)


def hopper_or_simulator():
    """Whether wgmma and TMA kernels run here: on an sm_90 GPU, or as the simulator's twins."""
    if SIMULATOR:
        return True
    from numba import cuda

    try:
        return cuda.get_current_device().compute_capability == (9, 0)  # wgmma: sm_90a only
    except Exception:  # no GPU at all
        return False


def routing(monkeypatch, module):
    """For a test of the public routing to a wgmma kernel: ``NUMBA_SOFTMAX_HOPPER`` set to
    "auto", no launch plan kept from another test (each call records anew until it
    repeats), and ``module.launch`` wrapped to note each launch through it (the
    configuration it names, else 1).  Returns the ``numba_softmax.attention`` module (the
    setting is its ``HOPPER``) and the notes."""
    import importlib

    from numba_softmax import plans

    api = importlib.import_module("numba_softmax.attention")  # the module, not the function
    monkeypatch.setattr(api, "HOPPER", "auto")
    monkeypatch.setattr(plans, "_PLANS", {})
    calls, launch = [], module.launch
    monkeypatch.setattr(module, "launch",
                        lambda *a, **kw: calls.append(kw.get("config", 1)) or launch(*a, **kw))
    return api, calls
