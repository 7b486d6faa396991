"""Softmax methods by name: which kernel runs a (rows, n) problem, and its launch.

(Interim: the launch configurations of the four softmax kernels, moved here from
``softmax.py`` unchanged; being reworked for the roofline.)
"""

from . import fused, launcher, online, split, three_pass

METHODS = ("auto", "three_pass", "fused", "online", "split")
FUSED_UP_TO = 8192  # longest row ``auto`` gives the fused kernel (measured)


def choose(rows, n, dtype, limits):
    """The kernel ``auto`` picks for a (rows, n) problem."""
    if n <= min(FUSED_UP_TO, fused.max_row(limits.max_threads)):
        return "fused"
    return "split" if rows < limits.sms // 2 else "online"


def launch(method, mode, x, y, stream=0):
    """Run ``method`` on (rows, n) device arrays; ``y`` is (rows, n) or (rows, 1)."""
    limits = launcher.device_limits()
    if method == "auto":
        method = choose(x.shape[0], x.shape[1], x.dtype, limits)
    max_threads = limits.max_threads
    if method == "fused":
        fused.launch(x, y, mode, stream=stream, max_threads=max_threads,
                     rows_per_block=max(1, min(4, max_threads // 32)))
    elif method == "online":
        online.launch(x, y, mode, threads=max_threads, stream=stream)
    elif method == "split":
        split.launch(x, y, mode, threads=min(256, max_threads), stream=stream, num_sms=limits.sms)
    else:
        three_pass.launch(x, y, mode, threads=min(256, max_threads), stream=stream)
