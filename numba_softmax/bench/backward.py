"""Backward passes, where ``numba_softmax`` has them.

* ``softmax_backward(dy, y)`` / ``log_softmax_backward(dy, y)``: GB/s of the three
  tensors each must move (y and dy read, dx written: 3·M·N·b), % of copy, against
  torch's own backward kernels (``torch._softmax_backward_data`` /
  ``torch._log_softmax_backward_data``).
* ``attention_backward(do, q, k, v, o, lse)``: TFLOP/s at 2.5× the forward's flops (five
  matmuls to the forward's two), against SDPA's backward (``torch.autograd.grad``
  through ``scaled_dot_product_attention``, same dtype).
"""

from .attention import forward_cases
from .context import ITEMSIZE, Skip, feature
from .results import attention_bytes, attention_flops

SHAPES = {"smoke": ((1, 64),), "quick": ((16384, 1024), (256, 262144)),
          "full": ((16384, 1024), (4096, 8192), (1024, 65536), (256, 262144), (1, 16777216))}
TORCH_BACKWARD = {"softmax_backward": "_softmax_backward_data",
                  "log_softmax_backward": "_log_softmax_backward_data"}


def flexible(fn, args, **options):
    """fn(*args, **options), dropping the options a (new) signature does not take."""
    try:
        return fn(*args, **options)
    except TypeError as e:
        if "keyword" not in str(e):
            raise
        return fn(*args)


def run_softmax(b):
    found, missing = {}, []
    for name in TORCH_BACKWARD:
        try:
            found[name] = feature(f"numba_softmax:{name}")
        except Skip as e:
            missing.append(str(e))
    if not found:
        raise Skip("; ".join(missing))
    for why in missing:
        b.skip("backward", why)
    dtypes = b.dtypes(b.cfg.pick(("float32",), ("float32", "bfloat16"),
                                 ("float32", "float16", "bfloat16")))
    for name, fn in found.items():
        for dtype in dtypes:
            for m, n in SHAPES[b.cfg.mode]:
                b.case(f"{name} {m}x{n} {dtype}", lambda: softmax_case(b, name, fn, m, n, dtype))


def softmax_case(b, name, fn, m, n, dtype):
    item = ITEMSIZE[dtype]
    k = b.n_sets(3 * m * n * item)
    kind = b.user_kind(dtype)
    sets = [tuple(b.view(b.random((m, n), dtype, 3 * s + j), kind) for j in range(3))
            for s in range(k)]  # (dy, y, dx)
    row = dict(suite="backward", dtype=dtype, M=m, N=n, bytes=3 * m * n * item, bound="copy")
    stream = b.call_stream

    def ours(i):
        dy, y, dx = sets[i]
        flexible(fn, (dy, y), out=dx, stream=stream)

    b.record(b.timer.device(ours, k), impl=name, level="kernel", array=kind, **row)
    if b.torch is not None:
        torch_fn = getattr(b.torch, TORCH_BACKWARD[name])

        def peer(i):
            dy, y, _ = sets[i]
            with b.on_stream("torch"):
                torch_fn(dy, y, -1, y.dtype)

        b.record(b.timer.device(peer, k), impl=f"torch.{name}", level="kernel", array="torch",
                 **row)


def run_attention(b):
    fn = feature("numba_softmax:attention_backward")
    forward = feature("numba_softmax:attention")

    cases = forward_cases(b)
    if b.cfg.quick:  # non-causal, S = 4096: fp16 both D, fp32 D = 64
        cases = [c for c in cases if not c[3] and (c[0] == "float16" or c[1] == 64)]
    for dtype, d, s, causal, batch, heads in cases:
        b.case(f"attention_backward {dtype} D{d} S{s} causal={causal}",
               lambda: attention_case(b, fn, forward, dtype, d, s, causal, batch, heads))


def attention_case(b, fn, forward, dtype, d, s, causal, batch, heads):
    item = ITEMSIZE[dtype]
    shape = (batch, heads, s, d)
    k = b.n_sets(2.5 * attention_bytes(batch, heads, s, s, d, item))
    kind = b.user_kind(dtype)
    sets = []
    for i in range(k):
        q, kk, v, do = (b.view(b.random(shape, dtype, 4 * i + j, -1.0, 2.0), kind)
                        for j in range(4))
        o, lse = forward(q, kk, v, causal=causal, return_lse=True)
        sets.append((do, q, kk, v, o, lse))
    row = dict(suite="backward", dtype=dtype, B=batch, H=heads, Sq=s, Sk=s, D=d, causal=causal,
               flops=int(2.5 * attention_flops(batch, heads, s, s, d, causal)))
    stream = b.call_stream

    def ours(i):
        flexible(fn, sets[i], causal=causal, stream=stream)

    b.record(b.timer.device(ours, k), impl="attention_backward", level="kernel", array=kind,
             **row)
    if b.torch is not None:
        torch = b.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        graphs = []
        with b.on_stream("torch"):  # autograd runs each backward on its forward's stream
            for do, q, kk, v, _, _ in sets:
                leaves = [t.detach().requires_grad_() for t in (q, kk, v)]
                graphs.append((sdpa(*leaves, is_causal=causal), leaves, do))

        def peer(i):
            out, leaves, do = graphs[i]
            with b.on_stream("torch"):
                torch.autograd.grad(out, leaves, do, retain_graph=True)

        b.record(b.timer.device(peer, k), impl="torch.backward", level="kernel", array="torch",
                 **row)
