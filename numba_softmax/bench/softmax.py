"""The softmax sweep: every method, every dtype, against torch, CuPy and two Triton kernels.

Per (M, N, dtype):

* kernel rows of every method of :data:`numba_softmax.kernels.softmax.methods.METHODS` —
  ``methods.launch`` on ready-made device arrays, configured as the public call
  configures it (``auto`` notes which kernel it chose);
* call rows of the public ``numba_softmax.softmax`` (``auto``; every method in full mode);
* peers, kernel rows (and a call row for torch): ``torch.softmax``,
  ``cupyx.scipy.special.softmax`` (float32/float16), and the Triton tutorial and seed-001
  kernels (:mod:`.triton_peers`) when Triton imports.

Each row carries the method's own traffic model (``model_bytes``: three_pass moves 4
passes of M·N·b, online and split 3, fused/onchip 2) and so shows, beside "% copy" (of
the compulsory 2 passes), "% own" — how close the kernel is to the bound its own
algorithm sets.  Every implementation's output is checked against ``torch.softmax`` in
float32 once (where torch is present) before it is timed.
"""

from ..kernels.softmax import methods
from ..kernels.rows.epilogue import SOFTMAX
from .context import ITEMSIZE, Skip, WrongResult
from .results import SAME_SIZE_COPY, method_traffic, softmax_bytes

SHAPES = ((16384, 1024), (8192, 4096), (4096, 8192), (2048, 16384), (1024, 65536),
          (256, 262144), (128, 1048576), (1, 16777216))
QUICK = {"float32": ((16384, 1024), (4096, 8192), (1024, 65536), (256, 262144),
                     (1, 16777216)),  # 1024 × 65536: rows past one block (cluster, group)
         "float16": ((16384, 1024), (1024, 65536), (256, 262144)),
         "bfloat16": ((16384, 1024), (256, 262144))}
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2, "float64": 1e-5}  # max |p − p_fp32|


def cases(b):
    """[(M, N, dtype)] for this run."""
    if b.cfg.smoke:
        return [(1, 64, "float32")]
    dtypes = b.dtypes(("float32", "float16", "bfloat16"))
    if b.cfg.quick:
        return [(m, n, dt) for dt in dtypes for m, n in QUICK[dt]]
    return [(m, n, dt) for dt in dtypes for m, n in SHAPES]


def run(b):
    for m, n, dtype in cases(b):
        b.case(f"softmax {m}x{n} {dtype}", lambda: one_shape(b, m, n, dtype))


def one_shape(b, m, n, dtype):
    import numba_softmax as ns

    item = ITEMSIZE[dtype]
    k = b.n_sets(softmax_bytes(m, n, item))
    xs = [b.random((m, n), dtype, seed=s) for s in range(k)]
    ys = [b.random((m, n), dtype, seed=100 + s) for s in range(k)]
    row = dict(suite="softmax", dtype=dtype, M=m, N=n, bytes=softmax_bytes(m, n, item),
               bound="copy")
    check = checker(b, xs[0], dtype)

    for method in methods.METHODS:  # kernel level: the kernel on device arrays
        chosen = _chosen(b, method, m, n, xs[0].dtype)

        def enqueue(i, method=method):
            methods.launch(method, SOFTMAX, xs[i], ys[i], stream=b.stream)

        model = method_traffic(chosen)
        note = f"auto → {chosen}" if method == "auto" else ""
        timed(b, f"{method} {m}x{n} {dtype}", enqueue, k, check, ys, impl=method,
               level="kernel", array="numba", note=note,
               model_bytes=model * m * n * item if model else None, **row)

    # the same bytes copied (read once, written once): what a problem of this size can
    # reach, beside the large copy the "% copy" column divides by
    timed(b, f"copy {m}x{n} {dtype}", lambda i: ys[i].copy_to_device(xs[i], stream=b.stream),
           k, None, None, impl=SAME_SIZE_COPY, level="kernel", array="numba", **row)

    kind = b.user_kind(dtype)
    user = [b.view(x, kind) for x in xs]
    for method in methods.METHODS if b.cfg.mode == "full" else ("auto",):
        def call(i, method=method):
            ns.softmax(user[i], method=method)

        timed(b, f"ns.softmax({kind}) {method}", call, k, None, None, impl=method,
               level="call", array=kind, host=True, **row)

    for peer, fn, model in _peers(b, dtype):
        tx, ty = [b.view(x, "torch") for x in xs], [b.view(y, "torch") for y in ys]

        def peer_kernel(i, fn=fn):
            with b.on_stream("torch"):
                fn(tx[i], ty[i])

        timed(b, f"{peer} {m}x{n} {dtype}", peer_kernel, k, None if peer == "torch" else check,
               ys, impl=peer,
               level="kernel", array="torch", model_bytes=model * m * n * item if model else None,
               **row)
        if peer == "torch":
            timed(b, f"torch call {m}x{n} {dtype}", lambda i, fn=fn: fn(tx[i], ty[i]), k, None,
                   None, impl=peer, level="call", array="torch", host=True, **row)
    if b.cupy is not None and dtype != "bfloat16":
        _cupy_peer(b, xs, k, row)


def _chosen(b, method, m, n, dtype):
    """The kernel ``auto`` runs for this shape (``method`` itself for the others)."""
    if method != "auto":
        return method
    try:
        return methods.choose(m, n, dtype, b.limits)
    except Exception:  # noqa: BLE001 - a changed chooser: say "auto", measure anyway
        return "auto"


def timed(b, label, fn, k, check, ys, host=False, **fields):
    """Time one implementation (a method that does not apply is skipped, not fatal)."""
    try:
        if check is not None:
            check(fn, ys[0], fields["impl"])
        timing = b.timer.host(fn, k) if host else b.timer.device(fn, k)
    except (Skip, ValueError) as e:
        b.skip(f"softmax {label}", str(e).split(";")[0])
        return
    except WrongResult as e:
        b.fail(f"softmax {label}", str(e))
        return
    b.record(timing, **fields)


def _peers(b, dtype):
    """(name, fn(x, y) on torch tensors, traffic passes or None) for each importable peer."""
    if b.torch is None:
        return []
    torch = b.torch
    peers = [("torch", lambda x, y: torch.softmax(x, dim=-1), None)]  # allocates, as users do
    try:
        from . import triton_peers
    except Exception:  # noqa: BLE001 - no Triton (or a broken one): no Triton rows
        return peers
    return peers + [(name, fn, triton_peers.TRAFFIC[name]) for name, fn in triton_peers.PEERS.items()]


def _cupy_peer(b, xs, k, row):
    from .env import optional

    special = optional("cupyx.scipy.special")
    fn = getattr(special, "softmax", None)
    if fn is None:
        return
    cx = [b.view(x, "cupy") for x in xs]

    def enqueue(i):
        with b.on_stream("cupy"):
            fn(cx[i], axis=-1)

    timed(b, "cupy", enqueue, k, None, None, impl="cupy", level="kernel", array="cupy", **row)


def checker(b, x, dtype):
    """check(run, y, impl): poison y with NaN, run(0), then y ≈ softmax(x) (torch, in
    float32) or :class:`WrongResult`.  None without torch (the simulator run checks
    nothing: the test suite does)."""
    if b.torch is None:
        return None
    ref = b.torch.softmax(b.view(x, "torch").float(), dim=-1)

    def check(run, y, impl):
        y_t = b.view(y, "torch")
        y_t.fill_(float("nan"))  # a value the implementation forgot to write cannot pass
        b.timer.sync()
        run(0)
        b.timer.sync()
        err = float((y_t.float() - ref).abs().max())
        if not err <= TOLERANCE[dtype]:
            raise WrongResult(f"{impl}: wrong result, max |p − p_ref| = {err:.3g} "
                               f"(tolerance {TOLERANCE[dtype]:g}); not timed")

    return check
