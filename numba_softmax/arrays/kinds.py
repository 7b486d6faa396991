"""Array libraries: the one module that knows NumPy, CuPy, PyTorch and Numba apart.

Everything above this module sees four operations on any array kind:

* :func:`describe` — kind, dtype, shape, element strides, data pointer, device;
* :func:`view` — a Numba device array over existing memory, with any shape and
  (non-negative) strides: how kernels read user arrays in place, zero-copy;
* :func:`empty` / :func:`full` — a new array of the user's kind, with its device view;
* :func:`to_user` — a device result handed back as the user's kind (NumPy: copied).

Every ``kind == ...`` branch of the package lives here.  On the CUDA simulator "device
memory" is host memory: a view is built from the same pointer arithmetic through NumPy's
``__array_interface__`` (so the view code runs in CI too, not only on a GPU).

bfloat16 (PyTorch ``torch.bfloat16``, or NumPy arrays of ``ml_dtypes.bfloat16``) is
described as dtype ``"bfloat16"`` and viewed on the device as ``uint16`` bits — the
kernels' convention (:mod:`numba_softmax.kernels.hw.jit`).
"""

import weakref

import numpy as np
from numba import cuda

from ..runtime.sim import simulator_enabled
from . import pool
from ..runtime import driver, record

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

    ``facts``: what :func:`facts` already read of ``x`` (a launch plan's look-up reads it
    for the plan key), if anything: the description is then built from it rather than
    read from the array a second time."""
    if facts is not None and facts[0] is not None and not simulator_enabled():
        return _from_facts(x, *facts)
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
    if _is_numba(x):  # its own attributes: building the array interface costs far more
        dtype = x.dtype
        item = dtype.itemsize
        return Described(x, kind, dtype, tuple(x.shape), tuple(s // item for s in x.strides),
                         _numba_ptr(x), item, current_device_id())
    desc = x.__cuda_array_interface__
    dtype = np.dtype(desc["typestr"])
    shape, item = tuple(desc["shape"]), dtype.itemsize
    strides = _byte_strides(x, desc)
    strides = c_strides(shape) if strides is None else tuple(s // item for s in strides)
    return Described(x, kind, dtype, shape, strides, desc["data"][0], item,
                     cuda.get_current_device().id)


def _from_facts(x, key, ptr):
    """:func:`describe` of ``x`` from its :func:`facts`: the same fields, as read there."""
    lib = key[0]
    if lib == "torch":
        _, dtype, shape, strides, device, _ = key
        if device.type != "cuda":  # a CPU tensor: refused, with the reason, by the full read
            return describe(x)
        return Described(x, lib, _dtype_named(str(dtype)[len("torch."):]), tuple(shape),
                         tuple(strides), ptr, x.element_size(), device.index)
    dtype = np.dtype(key[1])
    item = dtype.itemsize
    if lib == "cupy":
        _, _, shape, strides, device, _ = key
        return Described(x, lib, dtype, tuple(shape), tuple(s // item for s in strides), ptr,
                         item, device)
    _, _, shape, strides, _ = key  # a Numba array, or another CUDA-array-interface object
    shape = tuple(shape)
    strides = c_strides(shape) if strides is None else tuple(s // item for s in strides)
    device = current_device_id() if _is_numba(x) else cuda.get_current_device().id
    return Described(x, lib, dtype, shape, strides, ptr, item, device)


def _is_numba(x):
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
_NUMBA_FACTS = weakref.WeakKeyDictionary()  # Numba array -> (layout key, data pointer)


def _numba_facts(x):
    """(layout key, data pointer) of a Numba device array, read once per array: its
    shape, strides and memory are fixed for its life, and reading the pointer through
    Numba's properties is slow enough to show in a replayed call."""
    facts = _NUMBA_FACTS.get(x)
    if facts is None:
        ptr = _numba_ptr(x)
        facts = (("numba", x.dtype.str, x.shape, x.strides, ptr & 15), ptr)
        _NUMBA_FACTS[x] = facts
    return facts


def _numba_ptr(x):
    return x.device_ctypes_pointer.value or 0


def current_device_id():
    """The device of this thread's current CUDA context (asked of the driver: Numba's
    ``get_current_device`` is slow for a path that is all host time)."""
    dev = driver.current_device()
    return cuda.get_current_device().id if dev is None else dev  # none yet: Numba makes one


def _byte_strides(x, desc):
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


def _typestr(dtype):
    return "<u2" if dtype == BFLOAT16 else np.dtype(dtype).str


class _HostMemory:
    """An object exposing host memory through ``__array_interface__`` (simulator views)."""

    def __init__(self, iface, owner):
        self.__array_interface__, self.owner = iface, owner


def view(owner, ptr, shape, strides, dtype):
    """A Numba device array over memory owned by ``owner`` (kept alive by the view):
    ``shape``, element ``strides`` (all >= 0), ``dtype`` (``"bfloat16"`` → uint16 bits)."""
    typestr = _typestr(dtype)
    item = np.dtype(typestr).itemsize
    iface = dict(shape=tuple(shape), strides=tuple(s * item for s in strides),
                 data=(ptr, False), typestr=typestr, version=3)
    if simulator_enabled():
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(np.asarray(_HostMemory(iface, owner)))
    return cuda.from_cuda_array_interface(iface, owner=owner, sync=False)


def view_of(d, shape=None, strides=None, offset=0):
    """A device view of a described device array (default: its own shape and strides),
    starting ``offset`` elements past its data pointer."""
    return view(d.obj, d.ptr + offset * d.itemsize, d.shape if shape is None else shape,
                d.strides if strides is None else strides, d.dtype)


def _torch_dtype(torch, dtype):
    return torch.bfloat16 if dtype == BFLOAT16 else getattr(torch, np.dtype(dtype).name)


def _cupy_dtype(dtype):
    if dtype == BFLOAT16:
        raise TypeError("CuPy has no bfloat16 arrays; use PyTorch tensors for bfloat16")
    return dtype


def empty(kind, shape, dtype, like=None, stream=0):
    """(user array, its contiguous device view): a new array of ``kind`` on the device of
    ``like``.  For NumPy the "user array" is a Numba device array (copied back by
    :func:`to_user`).  Noted by a launch-plan recording in progress."""
    shape = tuple(shape)
    if kind == "torch":
        import torch

        buf = torch.empty(shape, dtype=_torch_dtype(torch, dtype), device=like.device)
        ptr = buf.data_ptr()
    elif kind == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            buf = cupy.empty(shape, dtype=_cupy_dtype(dtype))
        ptr = buf.data.ptr
    else:
        buf = pool.device_array(shape, np.dtype(_typestr(dtype)), stream=stream)
        return record.allocated(buf, buf, (kind, shape, dtype, None))
    dev = view(buf, ptr, shape, c_strides(shape), dtype) if all(shape) else None
    return record.allocated(buf, dev, (kind, shape, dtype, like.device))


def allocator(recipe, arrays=()):
    """A function ``(stream, arrays) -> (user array, data pointer)`` that makes a buffer
    like the one a recipe noted by :func:`empty` describes (plan replay; what can be
    looked up once — library dtype, device, a template — is looked up here).  ``arrays``:
    the call's arrays when the plan is made.  PyTorch buffers copy an input of their very
    layout (contiguous, same shape, dtype and device) with ``empty_like`` — less host
    time than ``empty`` — or else one of their dtype and device with ``new_empty``; the
    plan key pins every input's layout, so the template stays one on every replay."""
    kind, shape, dtype, device = recipe
    if kind == "torch":
        import torch

        empty_, t_dtype = torch.empty, _torch_dtype(torch, dtype)
        kin = [j for j, a in enumerate(arrays) if type(a).__module__.startswith("torch")
               and a.dtype == t_dtype and a.device == device]
        like = next((j for j in kin if arrays[j].shape == shape
                     and arrays[j].is_contiguous()), None)
        if like is not None:
            empty_like = torch.empty_like

            def make(stream, arrays):
                buf = empty_like(arrays[like])
                return buf, buf.data_ptr()
        elif kin:  # new_empty: its dtype and device, not parsed again (cheaper than empty)
            like = kin[0]

            def make(stream, arrays):
                buf = arrays[like].new_empty(shape)
                return buf, buf.data_ptr()
        else:
            def make(stream, arrays):
                buf = empty_(shape, dtype=t_dtype, device=device)
                return buf, buf.data_ptr()
    elif kind == "cupy":
        import cupy

        dev_id = device.id
        if cupy.cuda.Device().id == dev_id:  # the plan key pins the current context
            def make(stream, arrays):
                buf = cupy.empty(shape, dtype=dtype)
                return buf, buf.data.ptr
        else:
            def make(stream, arrays):
                with cupy.cuda.Device(dev_id):  # a fresh one: a Device's with-stack is its own
                    buf = cupy.empty(shape, dtype=dtype)
                return buf, buf.data.ptr
    else:
        pooled = pool.allocator(shape, np.dtype(_typestr(dtype)))

        def make(stream, arrays):
            return pooled(stream)
    return make


def full(kind, shape, value, dtype, like=None):
    """An array of ``kind`` filled with ``value`` (results that need no kernel)."""
    if kind == "torch":
        import torch

        return torch.full(tuple(shape), value, dtype=_torch_dtype(torch, dtype), device=like.device)
    if kind == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.full(tuple(shape), value, dtype=_cupy_dtype(dtype))
    host = np.full(tuple(shape), value, dtype=np.float32 if dtype == BFLOAT16 else dtype)
    if dtype == BFLOAT16:
        host = _as_bfloat16_host(host)
    return host if kind == "numpy" else cuda.to_device(host)


def _as_bfloat16_host(host):
    """float32 NumPy values as an ``ml_dtypes.bfloat16`` array (NumPy bfloat16 inputs only
    exist when ml_dtypes is installed)."""
    import ml_dtypes

    return host.astype(ml_dtypes.bfloat16)


def host_bits(host):
    """A NumPy array as the device sees it: bfloat16 → its uint16 bits."""
    return host.view(np.uint16) if host.dtype.name == BFLOAT16 else host


def to_device(host, stream=0):
    """A contiguous NumPy array copied to a new Numba device array (noted for plans).

    NumPy calls an array C-contiguous whatever stride its size-1 axes carry (one element
    reversed, ``x[::-1]``, has a negative one); Numba sizes the device copy from the
    strides and would see an empty extent, so such an array is repacked first."""
    if host.strides != tuple(s * host.itemsize for s in c_strides(host.shape)):
        host = np.array(host, order="C", copy=True)
    return record.staged(cuda.to_device(host_bits(host), stream=stream), host)


def to_user(kind, buf, stream=0, dtype=None):
    """The user-kind result for a buffer made by :func:`empty` (NumPy: copied to the host,
    bfloat16 bits given back as ``ml_dtypes.bfloat16``)."""
    if kind != "numpy":
        return buf
    host = buf.copy_to_host(stream=stream)
    if stream:
        stream.synchronize()  # copy_to_host on a stream is asynchronous
    return host.view(_bf16_numpy()) if dtype == BFLOAT16 else host


def _bf16_numpy():
    import ml_dtypes

    return ml_dtypes.bfloat16


def reshape(kind, buf, shape, order=None):
    """``buf`` (contiguous) reshaped, then its axes permuted by ``order`` (no copy)."""
    if kind in ("torch", "cupy", "numpy"):
        out = buf if tuple(buf.shape) == tuple(shape) else buf.reshape(shape)
        if not order:
            return out
        return out.permute(order) if kind == "torch" else out.transpose(order)
    out = buf.reshape(*shape) if shape else buf.reshape(1)[0:1].reshape(())
    if not order or list(order) == sorted(order):
        return out
    d = describe(out, "numba")  # Numba transposes only 2-D arrays: permute by strides
    return view_of(d, tuple(d.shape[i] for i in order), tuple(d.strides[i] for i in order))


# --- what a launch plan needs, fast ----------------------------------------------------
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
    return ("numba", desc["typestr"], desc["shape"], _byte_strides(x, desc), ptr & 15), ptr


def _reader(x):
    """The facts reader for ``type(x)``."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        return _torch_facts
    if mod.startswith("cupy"):
        return _cupy_facts
    if _is_numba(x):
        return _numba_facts
    if isinstance(x, np.ndarray):
        return lambda _: (None, None)
    return _interface_facts


_FACTS = {}  # Python type -> its facts reader


def to_numpy(x):
    """Any array kind's values as a NumPy array (tests and the plans' self-check)."""
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__
    if mod.startswith("torch"):
        t = x.detach()
        return (t.float() if str(t.dtype) == "torch.bfloat16" else t).cpu().numpy()
    if mod.startswith("cupy"):
        import cupy

        return cupy.asnumpy(x)
    return x.copy_to_host()


def cast(x, like):
    """``x`` (a NumPy, CuPy or PyTorch array) in ``like``'s dtype — ``like`` an array of the
    same library, or a NumPy dtype — sharing ``x``'s memory where the dtype already is."""
    dtype = like if isinstance(like, (np.dtype, type, str)) else like.dtype
    if is_torch(x):
        import torch

        return x.to(dtype if isinstance(dtype, torch.dtype) else _torch_dtype(torch, dtype))
    return x.astype(dtype, copy=False)


def concatenate(parts, axis):
    """NumPy, CuPy or PyTorch arrays (all of one library) joined along ``axis``."""
    if is_torch(parts[0]):
        import torch

        return torch.cat(parts, dim=axis)
    if type(parts[0]).__module__.startswith("cupy"):
        import cupy

        return cupy.concatenate(parts, axis=axis)
    return np.concatenate(parts, axis=axis)


# --- streams ------------------------------------------------------------------------------
_EXTERNAL = {}


def as_stream(stream):
    """A Numba stream from: None (the default stream), a Numba stream, a raw
    ``cudaStream_t`` handle (int), or a CuPy / PyTorch stream object."""
    if stream is None or (isinstance(stream, int) and not isinstance(stream, bool) and stream == 0):
        return 0  # the legacy default stream
    if hasattr(stream, "handle") and hasattr(stream, "synchronize") and not hasattr(stream, "ptr"):
        return stream  # already a Numba stream
    handle = getattr(stream, "cuda_stream", getattr(stream, "ptr", stream))
    if not isinstance(handle, int) or isinstance(handle, bool):
        raise TypeError(f"stream must be a Numba/CuPy/PyTorch stream or an int handle, "
                        f"got {type(stream).__name__}")
    if handle == 0:
        return 0  # e.g. torch.cuda.current_stream() when nothing else was chosen
    if handle not in _EXTERNAL:
        _EXTERNAL[handle] = cuda.external_stream(handle)
    return _EXTERNAL[handle]


def stream_key(stream):
    """A hashable identity of a stream from :func:`as_stream`."""
    if not stream:
        return 0
    try:
        return int(stream)  # a Numba stream's int() is its handle
    except TypeError:
        return id(stream)  # the simulator's streams have none
