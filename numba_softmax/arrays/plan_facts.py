"""What a launch plan's look-up reads of an array, fast: its layout key and data pointer.

A plan hit (:mod:`numba_softmax.plans`) costs what reading its arrays costs, so each
Python type gets a reader of its own, chosen once, that does plain attribute reads —
and a Numba array, whose layout and memory are fixed for its life, is read once.
:func:`.kinds.describe` can then be built from these facts rather than read again.
"""

import weakref

import numpy as np

from .kinds import byte_strides, is_numba, numba_pointer

_NUMBA_FACTS = weakref.WeakKeyDictionary()  # Numba array -> (layout key, data pointer)


def layout_key(x):
    """A hashable summary of a CUDA array's layout (library, dtype, shape, strides,
    device, 16-byte alignment) — the part of a plan key an array contributes; None for
    NumPy arrays (no plan) and anything unsupported.  Cheap: plain attribute reads."""
    return facts(x)[0]


def pointer(x):
    """The data pointer of a CUDA array (plan replay)."""
    return facts(x)[1]


def facts(x):
    """(:func:`layout_key`, :func:`pointer`) of ``x`` in one pass — what a plan hit needs
    of each array — read by a function chosen once per Python type."""
    read = _FACTS.get(type(x))
    if read is None:
        read = _FACTS.setdefault(type(x), _reader(x))
    return read(x)


def _torch_facts(x):
    ptr = x.data_ptr()
    return ("torch", x.dtype, x.shape, x.stride(), x.device, ptr & 15), ptr


def _cupy_facts(x):
    ptr = x.data.ptr
    return ("cupy", x.dtype, x.shape, x.strides, x.device.id, ptr & 15), ptr


def _interface_facts(x):
    desc = getattr(x, "__cuda_array_interface__", None)
    if desc is None:
        return None, None
    ptr = desc["data"][0]
    return ("numba", desc["typestr"], desc["shape"], byte_strides(x, desc), ptr & 15), ptr


def _reader(x):
    """The facts reader for ``type(x)``."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        return _torch_facts
    if mod.startswith("cupy"):
        return _cupy_facts
    if is_numba(x):
        return _numba_facts
    if isinstance(x, np.ndarray):
        return lambda _: (None, None)
    return _interface_facts


_FACTS = {}  # Python type -> its facts reader


def _numba_facts(x):
    """(layout key, data pointer) of a Numba device array, read once per array: its
    shape, strides and memory are fixed for its life, and reading the pointer through
    Numba's properties is slow enough to show in a replayed call."""
    facts = _NUMBA_FACTS.get(x)
    if facts is None:
        ptr = numba_pointer(x)
        facts = (("numba", x.dtype.str, x.shape, x.strides, ptr & 15), ptr)
        _NUMBA_FACTS[x] = facts
    return facts
