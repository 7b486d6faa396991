"""Array libraries told apart: what an array of NumPy, CuPy, PyTorch or Numba is.

* :func:`describe` — kind, dtype, shape, element strides, data pointer, device;
* :func:`view` — a Numba device array over existing memory, with any shape and
  (non-negative) strides: how kernels read user arrays in place, zero-copy;
* :func:`kind_of` — which library, for the few places that branch on it.

What is done with each library's arrays — new ones, results handed back, streams — is
:mod:`.ops`, and what a launch plan reads of one, fast, :mod:`.plan_facts`: every
library branch of the package is in these three modules.

On the CUDA simulator "device memory" is host memory: a view is built from the same
pointer arithmetic through NumPy's ``__array_interface__`` (so the view code runs in CI
too).

bfloat16 (PyTorch ``torch.bfloat16``, or NumPy arrays of ``ml_dtypes.bfloat16``) is
described as dtype ``"bfloat16"`` and viewed on the device as ``uint16`` bits — the
kernels' convention (:mod:`numba_softmax.kernels.hw.jit`).
"""

import numpy as np
from numba import cuda

from ..runtime import driver
from ..runtime.sim import simulator_enabled

BFLOAT16 = "bfloat16"
FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), BFLOAT16)


class Described:
    """What the layer knows of one array (elements, not bytes)."""

    __slots__ = ("obj", "kind", "dtype", "shape", "strides", "ptr", "itemsize", "device")

    def __init__(self, obj, kind, dtype, shape, strides, ptr, itemsize, device):
        self.obj, self.kind, self.dtype = obj, kind, dtype
        self.shape, self.strides, self.ptr = shape, strides, ptr
        self.itemsize, self.device = itemsize, device

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def on_host(self):
        """A NumPy array: its values must be copied to the device (and results back)."""
        return self.kind == "numpy"

    @property
    def size(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def extent(self):
        """[first, last] byte this array touches (an empty array touches none)."""
        if not self.size:
            return self.ptr, self.ptr - 1
        lo = hi = 0
        for s, st in zip(self.shape, self.strides):
            (hi := hi + (s - 1) * st) if st > 0 else (lo := lo + (s - 1) * st)
        return self.ptr + lo * self.itemsize, self.ptr + hi * self.itemsize + self.itemsize - 1


def kind_of(x):
    """"numpy", "cupy", "torch" or "numba"; TypeError for anything else."""
    if isinstance(x, (np.ndarray, np.generic)):  # a NumPy scalar is a 0-d array
        return "numpy"
    mod = type(x).__module__.split(".", 1)[0]
    if mod == "torch":
        if not x.is_cuda:
            raise TypeError("PyTorch tensors must live on a CUDA device; got a CPU tensor "
                            "(pass x.numpy() to compute on NumPy, or x.cuda())")
        return "torch"
    if mod == "cupy":
        return "cupy"
    if hasattr(x, "__cuda_array_interface__") or type(x).__name__ == "FakeCUDAArray":
        return "numba"
    raise TypeError(f"expected a NumPy array or a CUDA array (CuPy, PyTorch, Numba), "
                    f"got {type(x).__name__}")


def is_torch(x):
    """A PyTorch tensor, on any device (without importing PyTorch)."""
    return type(x).__module__.split(".", 1)[0] == "torch"


def _dtype_named(name):
    """A NumPy dtype for a library's dtype name, ``"bfloat16"``, or the name itself when
    NumPy has no such dtype (kept for the error message that names it)."""
    if name == BFLOAT16:
        return BFLOAT16
    try:
        return np.dtype(name)
    except TypeError:
        return name


def _np_dtype(dtype):
    return BFLOAT16 if dtype.name == BFLOAT16 else dtype


def describe(x, kind=None, facts=None):
    """:class:`Described` for any supported array (TypeError otherwise).

    ``facts``: what :func:`.plan_facts.facts` already read of ``x`` (a launch plan's look-up reads it
    for the plan key), if anything: the description is then built from it rather than
    read from the array a second time."""
    if facts is not None and facts[0] is not None and not simulator_enabled():
        return from_facts(x, *facts)
    kind = kind or kind_of(x)
    if kind == "torch":
        name = str(x.dtype)[len("torch."):]
        return Described(x, kind, _dtype_named(name), tuple(x.shape), tuple(x.stride()),
                         x.data_ptr(), x.element_size(), x.device.index)
    if kind == "cupy":
        item = x.dtype.itemsize
        return Described(x, kind, np.dtype(x.dtype), tuple(x.shape),
                         tuple(s // item for s in x.strides), x.data.ptr, item, x.device.id)
    if kind == "numpy" or simulator_enabled():
        if isinstance(x, np.generic):
            x = np.asarray(x)
        host = x if kind == "numpy" else x._ary
        item = host.dtype.itemsize
        return Described(x, kind, _np_dtype(host.dtype), tuple(host.shape),
                         tuple(s // item for s in host.strides),
                         host.__array_interface__["data"][0], item, None)
    if is_numba(x):  # its own attributes: building the array interface costs far more
        dtype = x.dtype
        item = dtype.itemsize
        return Described(x, kind, dtype, tuple(x.shape), tuple(s // item for s in x.strides),
                         numba_pointer(x), item, current_device_id())
    desc = x.__cuda_array_interface__
    dtype = np.dtype(desc["typestr"])
    shape, item = tuple(desc["shape"]), dtype.itemsize
    strides = byte_strides(x, desc)
    strides = c_strides(shape) if strides is None else tuple(s // item for s in strides)
    return Described(x, kind, dtype, shape, strides, desc["data"][0], item,
                     cuda.get_current_device().id)


def from_facts(x, key, ptr):
    """:func:`describe` of ``x`` from its :func:`.plan_facts.facts`: the same fields, as read there."""
    lib = key[0]
    if lib == "torch":
        _, dtype, shape, strides, device, _ = key
        if device.type != "cuda":  # a CPU tensor: refused, with the reason, by the full read
            return describe(x)
        return Described(x, lib, _dtype_named(str(dtype)[len("torch."):]), tuple(shape),
                         tuple(strides), ptr, x.element_size(), device.index)
    dtype = x.dtype if is_numba(x) else np.dtype(key[1])  # as describe reads it
    item = dtype.itemsize
    if lib == "cupy":
        _, _, shape, strides, device, _ = key
        return Described(x, lib, dtype, tuple(shape), tuple(s // item for s in strides), ptr,
                         item, device)
    _, _, shape, strides, _ = key  # a Numba array, or another CUDA-array-interface object
    shape = tuple(shape)
    strides = c_strides(shape) if strides is None else tuple(s // item for s in strides)
    device = current_device_id() if is_numba(x) else cuda.get_current_device().id
    return Described(x, lib, dtype, shape, strides, ptr, item, device)


def is_numba(x):
    """A Numba device array (not the simulator's fake one: that is described as host)."""
    types = _NUMBA_TYPES.get("types")
    if types is None:
        if simulator_enabled():
            types = ()
        else:
            from numba.cuda.cudadrv.devicearray import DeviceNDArrayBase

            types = (DeviceNDArrayBase,)
        _NUMBA_TYPES["types"] = types
    return isinstance(x, types)


_NUMBA_TYPES = {}


def numba_pointer(x):
    return x.device_ctypes_pointer.value or 0


def current_device_id():
    """The device of this thread's current CUDA context (asked of the driver: Numba's
    ``get_current_device`` is slow for a path that is all host time)."""
    dev = driver.current_device()
    return cuda.get_current_device().id if dev is None else dev  # none yet: Numba makes one


def byte_strides(x, desc):
    """Byte strides of a CUDA-array-interface object (None: C-contiguous).  Numba's own
    interface says None for any array it finds contiguous *ignoring broadcast axes*
    (numba-cuda 0.30's ``is_contiguous``): a stride-0 view would pass for a packed array
    and be read or written past its memory.  Numba arrays give their real strides."""
    if type(x).__module__.startswith("numba"):
        return tuple(x.strides)
    return desc.get("strides")


def c_strides(shape):
    """Element strides of a C-contiguous array of ``shape``."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def device_typestr(dtype):
    """The device typestr of ``dtype`` (``"bfloat16"``: its uint16 bits)."""
    return "<u2" if dtype == BFLOAT16 else np.dtype(dtype).str


class _HostMemory:
    """An object exposing host memory through ``__array_interface__`` (simulator views)."""

    def __init__(self, iface, owner):
        self.__array_interface__, self.owner = iface, owner


def view(owner, ptr, shape, strides, dtype):
    """A Numba device array over memory owned by ``owner`` (kept alive by the view):
    ``shape``, element ``strides`` (all >= 0), ``dtype`` (``"bfloat16"`` → uint16 bits)."""
    code = device_typestr(dtype)
    item = np.dtype(code).itemsize
    iface = dict(shape=tuple(shape), strides=tuple(s * item for s in strides),
                 data=(ptr, False), typestr=code, version=3)
    if simulator_enabled():
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(np.asarray(_HostMemory(iface, owner)))
    return cuda.from_cuda_array_interface(iface, owner=owner, sync=False)


def view_of(d, shape=None, strides=None, offset=0):
    """A device view of a described device array (default: its own shape and strides),
    starting ``offset`` elements past its data pointer."""
    return view(d.obj, d.ptr + offset * d.itemsize, d.shape if shape is None else shape,
                d.strides if strides is None else strides, d.dtype)
