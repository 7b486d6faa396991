"""Result rows, the byte and FLOP models, derived figures and the sanity check.

Every measurement becomes one :class:`Result` (one CSV row; the columns are documented
in :mod:`numba_softmax.bench`).  :func:`derive` fills the rates from the models;
:func:`check` then holds every figure to what the device can physically do and raises
:class:`ImpossibleFigure` — the program stops rather than print a number that cannot be
true (a timing or byte-count bug, never a result).
"""

import dataclasses

# Bytes each softmax method really moves, in units of M·N·itemsize (reads + writes), when
# numba_softmax.kernels.softmax.methods has no TRAFFIC table of its own.
TRAFFIC = {"three_pass": 4, "online": 3, "split": 3, "fused": 2, "onchip": 2, "cluster": 2}
TOLERANCE = 1.05  # a figure above 105 % of its ceiling is impossible
SAME_SIZE_COPY = "copy (same bytes)"  # softmax: a device copy of the problem's own bytes
# The rows "x torch" divides by: torch's implementation of the same problem.
TORCH_IMPLS = ("torch", "torch.sdpa", "torch.backward", "torch.softmax_backward",
               "torch.log_softmax_backward", "torch.topk(softmax)")


class ImpossibleFigure(RuntimeError):
    """A measured figure above what the device can do: the measurement is wrong."""


@dataclasses.dataclass
class Result:
    suite: str  # bounds | softmax | attention | decode | backward | topk | overhead
    impl: str
    level: str  # kernel (CUDA events) | call (host clock around the public call)
    array: str  # the array kind the call was given
    dtype: str
    median_ms: float
    min_ms: float
    reps: int
    M: int = None
    N: int = None
    B: int = None
    H: int = None
    Hkv: int = None
    Sq: int = None
    Sk: int = None
    D: int = None
    causal: bool = None
    splits: int = None
    page: int = None
    k: int = None
    bytes: int = None
    flops: int = None
    gbps: float = None
    pct_copy: float = None
    bound: str = None  # copy | read | peak: what this row's pct_bound divides by
    pct_bound: float = None
    model_bytes: int = None  # bytes this method really moves (its own traffic model)
    pct_model: float = None  # model_bytes / time, % of copy: % of the method's own bound
    tflops: float = None
    x_torch: float = None  # torch's time / this row's time (> 1: faster than torch)
    base: str = None  # overhead rows: the call compared with
    base_ms: float = None
    x_base: float = None  # this row's time / base_ms (< 1: faster)
    target: str = None  # pass | FAIL: the overhead target (overhead: x_base <= 2)
    goal: str = None  # pass | miss: the overhead goal (overhead: x_base <= 1.5)
    note: str = ""


CSV_COLUMNS = [f.name for f in dataclasses.fields(Result)]
_PEER_KEY = ("suite", "level", "dtype", "M", "N", "B", "H", "Hkv", "Sq", "Sk", "D", "causal", "k")


def _peer_key(r):
    """What a row and its torch peer share: the shape fields, and for the softmax
    backward rows which function (softmax's backward is held to torch's softmax backward,
    log_softmax's to torch's log_softmax backward — one shape, two peers)."""
    family = "log" if r.suite == "backward" and "log_softmax" in r.impl else ""
    return tuple(getattr(r, k) for k in _PEER_KEY) + (family,)


@dataclasses.dataclass
class Bounds:
    """The ceilings measured in this run (GB/s), and the device's theoretical peaks."""

    copy_gbps: float = None  # device-to-device copy, bytes read + written
    read_gbps: float = None  # the fastest read-only stream measured (≥ copy)
    dram_gbps: float = None  # memory clock × bus width
    tflops: dict = dataclasses.field(default_factory=dict)  # dtype → dense peak

    def gbps_for(self, bound):
        if bound == "read":
            return max(self.read_gbps or 0.0, self.copy_gbps or 0.0) or None
        return self.copy_gbps


# --- models ------------------------------------------------------------------------------
def softmax_bytes(m, n, itemsize):
    """Compulsory traffic of an (m, n) softmax: read every input once, write every output once."""
    return 2 * m * n * itemsize


def method_traffic(method):
    """Passes over M·N·itemsize a softmax method moves (reads + writes), or None:
    ``methods.TRAFFIC[method]`` (a number, or a (reads, writes) pair) where the kernels
    publish it, else :data:`TRAFFIC`."""
    try:
        from ..kernels.softmax import methods

        table = getattr(methods, "TRAFFIC", None) or {}
    except ImportError:
        table = {}
    value = table.get(method, TRAFFIC.get(method))
    if isinstance(value, (tuple, list)):
        value = sum(value)
    return value if isinstance(value, (int, float)) else None


def attention_flops(b, h, sq, sk, d, causal=False):
    """4·B·H·Sq·Sk·D (QKᵀ and PV, 2 flops per multiply-add), halved for causal."""
    flops = 4 * b * h * sq * sk * d
    return flops // 2 if causal else flops


def attention_bytes(b, h, sq, sk, d, itemsize, h_kv=None):
    """q and o (Sq rows, Hq heads), k and v (Sk rows, Hkv heads): each moved once."""
    h_kv = h if h_kv is None else h_kv
    return b * (2 * h * sq + 2 * h_kv * sk) * d * itemsize


def gbps(n_bytes, ms):
    return n_bytes / (ms * 1e-3) / 1e9


# --- derived figures and the check -------------------------------------------------------
def derive(results, bounds):
    """Fill GB/s, % of copy, % of the row's bound and of its own traffic model, TFLOP/s
    and the ratio to torch (in place)."""
    torch_ms = {_peer_key(r): r.median_ms for r in results if r.impl in TORCH_IMPLS}
    for r in results:
        if r.bytes:
            r.gbps = gbps(r.bytes, r.median_ms)
            if bounds.copy_gbps:
                r.pct_copy = 100.0 * r.gbps / bounds.copy_gbps
            ceiling = bounds.gbps_for(r.bound or "copy")
            if ceiling and not r.flops:
                r.bound = r.bound or "copy"
                r.pct_bound = 100.0 * r.gbps / ceiling
        if r.model_bytes and bounds.copy_gbps:
            r.pct_model = 100.0 * gbps(r.model_bytes, r.median_ms) / bounds.copy_gbps
        if r.flops:
            r.tflops = r.flops / (r.median_ms * 1e-3) / 1e12
            peak = bounds.tflops.get(r.dtype)
            if peak:
                r.bound, r.pct_bound = "peak", 100.0 * r.tflops / peak
        ref = torch_ms.get(_peer_key(r))
        if ref is not None and r.suite != "overhead":
            r.x_torch = ref / r.median_ms
    return results


def describe(r):
    """A row in words, for messages."""
    shape = " ".join(f"{k}={getattr(r, k)}" for k in ("M", "N", "B", "H", "Hkv", "Sq", "Sk", "D",
                                                       "causal", "splits", "page", "k")
                     if getattr(r, k) is not None)
    return f"{r.suite} {r.impl} ({r.level}, {r.array}, {r.dtype}, {shape})"


def check(results, bounds):
    """Raise :class:`ImpossibleFigure` for the first row whose GB/s exceeds 105 % of its
    bound (the copy measured in this run; the read stream for read-mostly rows) or of the
    DRAM peak, or whose TFLOP/s exceeds 105 % of the device's peak."""
    for r in results:
        if r.suite == "bounds":
            continue
        read_mostly = r.bound != "copy" and r.bound is not None  # read, or a FLOP row
        ceiling = bounds.gbps_for("read" if read_mostly else "copy")
        name = "read-only stream" if read_mostly else "device-to-device copy"
        if r.gbps and ceiling and r.gbps > TOLERANCE * ceiling:
            raise ImpossibleFigure(
                f"{describe(r)}: {r.gbps:.5g} GB/s is {100 * r.gbps / ceiling:.0f} % of the "
                f"{name} measured in this run ({ceiling:.5g} GB/s) — impossible for a kernel "
                f"that moves at least the bytes counted")
        if r.gbps and bounds.dram_gbps and r.gbps > TOLERANCE * bounds.dram_gbps:
            raise ImpossibleFigure(f"{describe(r)}: {r.gbps:.5g} GB/s exceeds the device's "
                                   f"DRAM peak ({bounds.dram_gbps:.5g} GB/s)")
        peak = bounds.tflops.get(r.dtype)
        if r.dtype == "float32" and bounds.tflops.get("tf32"):  # a peer may run on TF32
            peak = max(peak or 0, bounds.tflops["tf32"])
        if r.tflops and peak and r.tflops > TOLERANCE * peak:
            raise ImpossibleFigure(f"{describe(r)}: {r.tflops:.4g} TFLOP/s exceeds the "
                                   f"device's {r.dtype} peak ({peak:.4g} TFLOP/s)")
