"""The textbook beside the fast kernels: what each rung of the ladder buys, measured.

Each rung of :mod:`numba_softmax.textbook` — through its own ``launch`` — is one row,
and the package's kernel of the same algorithm at the same shape is the row under it:

=====================  =====================================  ==========================
rung                   fast row                               shapes (quick; full adds)
=====================  =====================================  ==========================
s1 naive, s2 three     ``softmax(x, method="three_pass")``    4096 × 8192 float32;
pass                   (no fast kernel computes s1's formula) 16384 × 1024, 1024 × 16384
s3 online, s4 fused    ``method="online"``, ``"fused"``       as s1
s5 split               ``method="split"``                     64 × 262144; 16 × 4M
a1 flash (CUDA cores)  ``attention(q, k, v)`` float32         B4 H8 S4096 D64; S1024
a2 flash (mma.sync)    ``attention(q, k, v)`` float16         as a1
d1 split-KV decode     ``attention(..., num_splits=S)``, Sq 1 B1 H32 Sk32768 D128; more
b1 softmax backward    ``softmax_backward(dy, y)``            as s1
b2 flash backward      ``attention_backward`` float32         B2 H8 S2048 D64; S4096
=====================  =====================================  ==========================

Both rows of a pair get the same inputs, the same timer (:mod:`.timing`: CUDA events
behind a sleeping kernel, warm-up, median; on the default stream, where a rung's
``launch`` puts its kernels) and the same models: ``bytes`` is the problem's compulsory
traffic (softmax 2·M·N·4; attention Q, K, V, O once; decode the K/V cache, held to the
read stream), so "GB/s" and "% copy" compare the two rows; ``model_bytes`` is what the
rung's own docstring says it moves ("GB/s own", "% own" of copy: above 100 % where its
re-reads hit L2).  Attention rows are judged by FLOPs against the device's peak for the
unit they run on: float32 (CUDA cores' FP32 lanes) for a1 and b2, float16 (tensor cores)
for a2.  The fast row's "× textbook" is the rung's time over its own (> 1: faster); the
CSV keeps the rung in ``base``/``base_ms`` and fast / rung in ``x_base``.

Before timing, the rung's output (poisoned with NaN first) is compared once with the
fast kernel's: a mismatch fails the rung (not timed, listed under FAILED); the fast row
is still measured.
"""

import math

import numpy as np
from numba import cuda

from .attention import decode_splits, pow2_at_least
from .context import ITEMSIZE, WrongResult
from .results import attention_bytes, attention_flops, method_traffic, softmax_bytes
from .timing import Timer

SOFTMAX = {"smoke": ((2, 100),), "quick": ((4096, 8192),),
           "full": ((16384, 1024), (4096, 8192), (1024, 16384))}
LONG_ROWS = {"smoke": ((2, 300),), "quick": ((64, 262144),), "full": ((64, 262144), (16, 1 << 22))}
ATTENTION = {"smoke": ((1, 1, 20, 16),), "quick": ((4, 8, 4096, 64),),  # (B, H, S, D)
             "full": ((16, 8, 1024, 64), (4, 8, 4096, 64))}
BACKWARD = {"smoke": ((1, 1, 20, 16),), "quick": ((2, 8, 2048, 64),),
            "full": ((2, 8, 2048, 64), (4, 8, 4096, 64))}
DECODE = {"smoke": ((1, 2, 70, 16),), "quick": ((1, 32, 32768, 128),),  # (B, H, Sk, D)
          "full": ((1, 32, 32768, 128), (1, 32, 131072, 128), (16, 32, 4096, 128))}
A2_WARPS = 4  # a2's warps a block (16 query rows each): its query tile is 16·A2_WARPS rows
# (atol, rtol): a rung passes if max |rung − fast| <= atol + rtol·max |fast|
TOL = {"softmax": (1e-6, 1e-4), "float32": (1e-5, 1e-3), "float16": (1e-3, 2e-2)}
S1_NOTE = "beside s1: no fast kernel computes the naive formula"


def run(b):
    from .. import textbook  # noqa: F401 - the rungs' package: a missing one skips the section

    mode, timer = b.cfg.mode, Timer(0, b.sim, min_reps=b.cfg.min_reps, max_reps=b.cfg.max_reps,
                                    warmup=b.cfg.warmup, target_s=b.cfg.target_s, cap_s=b.cfg.cap_s)
    for m, n in SOFTMAX[mode]:
        for tag, method in (("s1", "three_pass"), ("s2", "three_pass"), ("s3", "online"),
                            ("s4", "fused")):
            b.case(f"textbook {tag} {m}x{n}", lambda: softmax_pair(b, timer, tag, method, m, n))
    for m, n in LONG_ROWS[mode]:
        b.case(f"textbook s5 {m}x{n}", lambda: softmax_pair(b, timer, "s5", "split", m, n))
    for batch, heads, s, d in ATTENTION[mode]:
        for dtype in ("float32", "float16"):
            b.case(f"textbook {'a1' if dtype == 'float32' else 'a2'} {dtype} S{s}",
                   lambda: attention_pair(b, timer, dtype, batch, heads, s, d))
    for batch, heads, sk, d in DECODE[mode]:
        b.case(f"textbook d1 B{batch} Sk{sk}", lambda: decode_pair(b, timer, batch, heads, sk, d))
    for m, n in SOFTMAX[mode]:
        b.case(f"textbook b1 {m}x{n}", lambda: softmax_backward_pair(b, timer, m, n))
    for batch, heads, s, d in BACKWARD[mode]:
        b.case(f"textbook b2 S{s}", lambda: attention_backward_pair(b, timer, batch, heads, s, d))


# --- the pair: validate once, then time the rung and the fast kernel --------------------------
def _poison(arrays):
    for a in arrays:
        a.copy_to_device(np.full(a.shape, np.nan, a.dtype))


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def mismatch(got, want, tol):
    """max |got − want| over the outputs both give, or None where within ``tol``."""
    atol, rtol = tol
    worst = 0.0
    for g, w in zip(_tuple(got), _tuple(want)):
        g, w = np.asarray(g.copy_to_host(), np.float64), np.asarray(w.copy_to_host(), np.float64)
        err = float(np.abs(g - w).max(initial=0.0)) if g.shape == w.shape else math.inf
        if not err <= atol + rtol * float(np.abs(w).max(initial=0.0)):  # NaN fails too
            worst = max(worst, err) if err == err else math.nan
    return worst or None


def pair(b, timer, tag, fast_impl, rung, fast, outputs, k, tol, row, model=(None, None),
         notes=("", "")):
    """``rung(i)``, ``fast(i)`` run on input set i and return their outputs; ``outputs``
    are the rung's set-0 outputs (poisoned before the check)."""
    _poison(outputs)
    timer.sync()
    got, want = rung(0), fast(0)
    timer.sync()
    err = mismatch(got, want, tol)
    shape = row.get("M") and f"{row['M']}x{row['N']}" or f"S{row['Sk']} D{row['D']}"
    base = {}
    if err is not None:
        b.fail(f"textbook {tag} {row['dtype']} {shape}",
               f"wrong result: max |rung − fast {fast_impl}| = {err:.3g} (atol {tol[0]:g}, "
               f"rtol {tol[1]:g}); not timed")
    else:
        r = b.record(timer.device(rung, k), impl=f"textbook {tag}", level="kernel", array="numba",
                     model_bytes=model[0], note=notes[0], **row)
        base = dict(base=r.impl, base_ms=r.median_ms)
    f = b.record(timer.device(fast, k), impl=f"fast {fast_impl}", level="kernel", array="numba",
                 model_bytes=model[1], note=notes[1], **row, **base)
    if base:
        f.x_base = f.median_ms / base["base_ms"]


def _sets(b, k, shapes, dtype, lo=-2.0, width=4.0):
    return [tuple(b.random(s, dtype, len(shapes) * i + j, lo, width) for j, s in enumerate(shapes))
            for i in range(k)]


def _threads(b):
    """The simulator runs a thread as a Python thread: 32 a block there, the rung's own
    default on a GPU."""
    return dict(threads=32) if b.sim else {}


# --- softmax ---------------------------------------------------------------------------------
def split_count(b, m, n):
    """s5's pieces a row: blocks for two per multiprocessor, none shorter than 1024 values."""
    if b.sim:
        return 3
    return max(2, min(pow2_at_least(-(-2 * b.limits.sms // m)), n // 1024))


def softmax_pair(b, timer, tag, method, m, n):
    import numba_softmax as ns
    from ..textbook import s1_naive, s2_three_pass, s3_online, s4_fused, s5_split

    k = b.n_sets(softmax_bytes(m, n, 4))
    xs = _sets(b, k, [(m, n)], "float32")
    ys = [cuda.device_array((m, n), np.float32) for _ in range(k)]
    yf = [cuda.device_array((m, n), np.float32) for _ in range(k)]
    opts, note = _threads(b), ""
    if tag == "s5":
        opts["splits"] = split_count(b, m, n)
        note = f"{opts['splits']} pieces a row"
    launch = {"s1": s1_naive.launch, "s2": s2_three_pass.launch, "s3": s3_online.launch,
              "s4": s4_fused.launch, "s5": s5_split.launch}[tag]
    if tag == "s4":
        opts = {}  # the fewest threads that hold the row (s4_fused.threads_for)
    passes = {"s1": 3, "s2": 4, "s3": 3, "s4": 2, "s5": 3}[tag]
    model = passes * m * n * 4 + (m * opts["splits"] * 8 * (1 + opts["splits"]) if tag == "s5" else 0)
    fast_passes = method_traffic(method)
    row = dict(suite="textbook", dtype="float32", M=m, N=n, bytes=softmax_bytes(m, n, 4),
               bound="copy")
    pair(b, timer, tag, method,
         lambda i: launch(xs[i][0], ys[i], **opts),
         lambda i: ns.softmax(xs[i][0], method=method, out=yf[i]),
         [ys[0]], k, TOL["softmax"], row,
         model=(model, fast_passes and fast_passes * m * n * 4),
         notes=(note, S1_NOTE if tag == "s1" else ""))


def softmax_backward_pair(b, timer, m, n):
    import numba_softmax as ns
    from ..textbook import b1_softmax_backward

    k = b.n_sets(3 * m * n * 4)
    sets = _sets(b, k, [(m, n), (m, n)], "float32")  # (dy, y): any y gives an exact check
    dx = [cuda.device_array((m, n), np.float32) for _ in range(k)]
    dxf = [cuda.device_array((m, n), np.float32) for _ in range(k)]
    row = dict(suite="textbook", dtype="float32", M=m, N=n, bytes=3 * m * n * 4, bound="copy")
    pair(b, timer, "b1", "softmax_backward",
         lambda i: b1_softmax_backward.launch(*sets[i], dx[i], **_threads(b)),
         lambda i: ns.softmax_backward(*sets[i], out=dxf[i]),
         [dx[0]], k, TOL["softmax"], row, model=(5 * m * n * 4, None))


# --- attention -------------------------------------------------------------------------------
def _heads(b, batch, heads, seqs, d, dtype, k):
    """k sets of (BH, S, D) device arrays, values in [−1, 1), one per entry of ``seqs``."""
    return _sets(b, k, [(batch * heads, s, d) for s in seqs], dtype, -1.0, 2.0)


def attention_pair(b, timer, dtype, batch, heads, s, d):
    import numba_softmax as ns
    from ..textbook import a1_flash, a2_flash_mma

    bh, item = batch * heads, ITEMSIZE[dtype]
    k = b.n_sets(attention_bytes(batch, heads, s, s, d, item))
    sets = _heads(b, batch, heads, (s, s, s), d, dtype, k)
    outs = [(cuda.device_array((bh, s, d), np.float32), cuda.device_array((bh, s), np.float32))
            for _ in range(k)]
    of = [cuda.device_array((bh, s, d), np.dtype(dtype)) for _ in range(k)]
    if dtype == "float32":
        tag, tr = "a1", -(-s // a1_flash.BR)
        rung = lambda i: a1_flash.launch(*sets[i], *outs[i])  # noqa: E731
    else:
        warps = 1 if b.sim else A2_WARPS
        tag, tr = "a2", -(-s // (16 * warps))
        rung = lambda i: a2_flash_mma.launch(*sets[i], *outs[i], warps=warps)  # noqa: E731
    # the rung's model: Q read and O written once (O in float32), K and V once a query tile
    model = bh * (item * (s * d + tr * s * 2 * d) + 4 * s * d)
    row = dict(suite="textbook", dtype=dtype, B=batch, H=heads, Sq=s, Sk=s, D=d, causal=False,
               bytes=attention_bytes(batch, heads, s, s, d, item),
               flops=attention_flops(batch, heads, s, s, d))
    pair(b, timer, tag, f"attention {dtype}", rung,
         lambda i: ns.attention(*sets[i], num_splits=1, out=of[i]),
         list(outs[0]), k, TOL[dtype], row, model=(model, None))


def decode_pair(b, timer, batch, heads, sk, d):
    import numba_softmax as ns
    from ..textbook import d1_split_kv

    bh = batch * heads
    cache = 2 * bh * sk * d * 4
    k = b.n_sets(cache)
    sets = _heads(b, batch, heads, (1, sk, sk), d, "float32", k)
    outs = [(cuda.device_array((bh, 1, d), np.float32), cuda.device_array((bh, 1), np.float32))
            for _ in range(k)]
    of = [cuda.device_array((bh, 1, d), np.float32) for _ in range(k)]
    splits = decode_splits(bh, b.limits.sms, sk)
    model = cache + 4 * bh * 2 * d + 2 * 4 * bh * splits * (d + 1)  # + q, o; partials out and in
    row = dict(suite="textbook", dtype="float32", B=batch, H=heads, Sq=1, Sk=sk, D=d,
               causal=False, splits=splits, bytes=cache, bound="read")
    pair(b, timer, "d1", "decode",
         lambda i: d1_split_kv.launch(*sets[i], *outs[i], splits=splits, **_threads(b)),
         lambda i: ns.attention(*sets[i], num_splits=splits, out=of[i]),
         list(outs[0]), k, TOL["float32"], row, model=(model, None))


def attention_backward_pair(b, timer, batch, heads, s, d):
    import numba_softmax as ns
    from ..textbook import b2_flash_backward as b2

    bh = batch * heads
    k = b.n_sets(8 * bh * s * d * 4)
    sets = []
    for q, kk, v, do in _heads(b, batch, heads, (s, s, s, s), d, "float32", k):
        o, lse = ns.attention(q, kk, v, return_lse=True)
        sets.append((do, q, kk, v, o, lse))
    grads = [tuple(cuda.device_array((bh, s, d), np.float32) for _ in range(3)) for _ in range(k)]
    tc = -(-s // b2.BC)  # key blocks: Q, dO, LSE, D read (and dQ added) once each
    model = 4 * bh * (tc * s * (2 * d + 2 + 2 * d) + 4 * s * d + 3 * s * d)
    row = dict(suite="textbook", dtype="float32", B=batch, H=heads, Sq=s, Sk=s, D=d, causal=False,
               bytes=8 * bh * s * d * 4, flops=int(2.5 * attention_flops(batch, heads, s, s, d)))
    pair(b, timer, "b2", "attention_backward",
         lambda i: b2.launch(*sets[i], grads=grads[i]),
         lambda i: ns.attention_backward(*sets[i]),
         list(grads[0]), k, TOL["float32"], row, model=(model, None))
