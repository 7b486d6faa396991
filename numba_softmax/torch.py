"""PyTorch integration: ``softmax``, ``log_softmax`` and ``attention`` with autograd.

    import numba_softmax.torch as nst
    y = nst.softmax(x, dim=-1)                   # x: a CUDA tensor
    o = nst.attention(q, k, v, causal=True)
    loss.backward()                              # through the package's backward kernels

Each is a ``torch.library.custom_op`` in the namespace ``numba_softmax`` (so
``torch.compile`` sees an opaque op it can trace around, through the fake
implementations registered here), with ``register_autograd``: the forward saves what the
backward needs — y for softmax and log_softmax, (q, k, v, O, LSE) for attention — and the
backward is itself an op calling :mod:`numba_softmax.backward`.  On CUDA tensors every op
calls the package's public functions on ``torch.cuda.current_stream()``.  A sliding
``window``, ``softcap`` or ``alibi_slopes`` take a twin pair of ops, ``attention_options``
(the plain pair keeps its schema).
On the CUDA simulator the attention ops also take CPU float16/float32 tensors, through
NumPy: so that tests and the examples' toy sizes run, gradients included, with no GPU.

Importing this module imports torch; importing :mod:`numba_softmax` does not.  The LSE
of attention is returned by the op but marked non-differentiable: gradients flow through
O only.  Double backward is not supported.
"""

from typing import Optional

import torch

from . import backward as _backward
from . import checks as _checks
from .attention import attention as _attention
from .runtime.sim import simulator_enabled as _simulating
from .softmax import log_softmax as _log_softmax
from .softmax import softmax as _softmax

__all__ = ["softmax", "log_softmax", "attention", "attention_varlen"]

_LIB = "numba_softmax"


_ROW_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _stream(t):
    return torch.cuda.current_stream(t.device)


def _tensor(x, name, dtypes):
    """``x`` checked to be a torch tensor of one of ``dtypes`` (a ``TypeError`` naming
    ``name`` otherwise).  Where it lives is the op's to check: it is registered for CUDA
    alone, and a fake or meta tensor (tracing, ``torch.compile``) passes through."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        names = ", ".join(str(d)[len("torch."):] for d in dtypes)
        raise TypeError(f"{name} must be a tensor of {names}, got {str(x.dtype)[6:]}")
    return x


def _row_args(x, dim):
    """The checks of ``softmax(x, dim)``: a floating tensor, an integer dim in range."""
    _tensor(x, "x", _ROW_DTYPES)
    dim = _checks.integer(dim, "dim")
    if not -max(x.dim(), 1) <= dim < max(x.dim(), 1):
        raise ValueError(f"dim must be in [{-max(x.dim(), 1)}, {max(x.dim(), 1)}) for a "
                         f"tensor of {x.dim()} dimensions, got {dim}")
    return dim


def _rows_like(x, dim):
    """An empty tensor laid out as the package returns a row-wise result: C order with
    ``dim`` moved last, then moved back (a view)."""
    dim = dim % max(x.dim(), 1)
    shape = list(x.shape)
    n = shape.pop(dim) if x.dim() else 1
    out = x.new_empty(shape + [n]) if x.dim() else x.new_empty(())
    return out.movedim(-1, dim) if x.dim() else out


# --- softmax and log_softmax ----------------------------------------------------------------
def _row_op(name, forward, backward):
    """Register ``name`` (x, dim) -> y and ``name_backward`` (dy, y, dim) -> dx, with
    autograd saving y."""

    @torch.library.custom_op(f"{_LIB}::{name}", mutates_args=(), device_types="cuda")
    def op(x: torch.Tensor, dim: int) -> torch.Tensor:
        return forward(x, dim, stream=_stream(x))

    @torch.library.custom_op(f"{_LIB}::{name}_backward", mutates_args=(), device_types="cuda")
    def op_backward(dy: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
        return backward(dy, y, dim, stream=_stream(y))

    op.register_fake(lambda x, dim: _rows_like(x, dim))
    op_backward.register_fake(lambda dy, y, dim: _rows_like(y, dim))

    def setup_context(ctx, inputs, output):
        ctx.dim = inputs[1]
        ctx.save_for_backward(output)  # the backward needs y only

    def grad(ctx, dy):
        (y,) = ctx.saved_tensors
        return op_backward(dy, y, ctx.dim), None

    op.register_autograd(grad, setup_context=setup_context)
    return op, op_backward


softmax_op, softmax_backward_op = _row_op("softmax", _softmax, _backward.softmax_backward)
log_softmax_op, log_softmax_backward_op = _row_op("log_softmax", _log_softmax,
                                                  _backward.log_softmax_backward)


def softmax(x, dim=-1):
    """``torch.softmax(x, dim)`` through the package's kernels, differentiable."""
    return softmax_op(x, _row_args(x, dim))


def log_softmax(x, dim=-1):
    """``torch.log_softmax(x, dim)`` through the package's kernels, differentiable."""
    return log_softmax_op(x, _row_args(x, dim))


# --- attention ------------------------------------------------------------------------------
@torch.library.custom_op(f"{_LIB}::attention", mutates_args=(), device_types="cuda")
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    return _attention(q, k, v, causal=causal, scale=scale, return_lse=True, stream=_stream(q))


@torch.library.custom_op(f"{_LIB}::attention_backward", mutates_args=(), device_types="cuda")
def attention_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          o: torch.Tensor, lse: torch.Tensor, causal: bool,
                          scale: Optional[float]
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward.attention_backward(do, q, k, v, o, lse, causal=causal, scale=scale,
                                        stream=_stream(q))


def _attention_fake(q, k, v, *_):
    return (q.new_empty(q.shape[:-1] + v.shape[-1:]),
            q.new_empty(q.shape[:-1], dtype=torch.float32))


attention_op.register_fake(_attention_fake)


@attention_backward_op.register_fake
def _(do, q, k, v, o, lse, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_setup(ctx, inputs, output):
    q, k, v, ctx.causal, ctx.scale = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse)  # LSE: P is rebuilt from it, tile by tile


def _attention_grad(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward_op(do, q, k, v, o, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


attention_op.register_autograd(_attention_grad, setup_context=_attention_setup)


# --- attention with options (window, softcap, ALiBi): a pair of its own, the plain schema
# unchanged ---------------------------------------------------------------------------------
@torch.library.custom_op(f"{_LIB}::attention_options", mutates_args=(), device_types="cuda")
def attention_options_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                         scale: Optional[float], left: int, right: int, softcap: float,
                         alibi_slopes: Optional[torch.Tensor]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    return _attention(q, k, v, causal=causal, window=(left, right), scale=scale,
                      softcap=softcap, alibi_slopes=alibi_slopes, return_lse=True,
                      stream=_stream(q))


@torch.library.custom_op(f"{_LIB}::attention_options_backward", mutates_args=(),
                         device_types="cuda")
def attention_options_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                                  v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                                  causal: bool, scale: Optional[float], left: int, right: int,
                                  softcap: float, alibi_slopes: Optional[torch.Tensor]
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward.attention_backward(do, q, k, v, o, lse, causal=causal, window=(left, right),
                                        scale=scale, softcap=softcap, alibi_slopes=alibi_slopes,
                                        stream=_stream(q))


attention_options_op.register_fake(_attention_fake)
attention_options_backward_op.register_fake(
    lambda do, q, k, v, o, lse, *_: (q.new_empty(q.shape), k.new_empty(k.shape),
                                     v.new_empty(v.shape)))


def _options_setup(ctx, inputs, output):
    q, k, v, *ctx.options = inputs  # causal, scale, left, right, softcap, alibi_slopes
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse)


def _options_grad(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_options_backward_op(do, q, k, v, o, lse, *ctx.options)
    return (dq, dk, dv) + (None,) * len(ctx.options)


attention_options_op.register_autograd(_options_grad, setup_context=_options_setup)


# --- the simulator: CPU tensors through NumPy ---------------------------------------------
def _host(fn):
    """``fn`` (a package call returning arrays) on CPU tensors: NumPy in, tensors out."""

    def kernel(*args):
        arrays = []
        for a in args:
            if isinstance(a, torch.Tensor):
                if a.dtype not in (torch.float16, torch.float32):
                    raise TypeError(f"on the CUDA simulator CPU tensors must be float16 or "
                                    f"float32, got {str(a.dtype)[6:]}")
                a = a.detach().contiguous().numpy()
            arrays.append(a)
        return tuple(torch.from_numpy(x.copy()) for x in fn(*arrays))

    return kernel


if _simulating():
    attention_op.register_kernel("cpu", _host(
        lambda q, k, v, causal, scale: _attention(q, k, v, causal=causal, scale=scale,
                                                  return_lse=True)))
    attention_backward_op.register_kernel("cpu", _host(
        lambda do, q, k, v, o, lse, causal, scale: _backward.attention_backward(
            do, q, k, v, o, lse, causal=causal, scale=scale)))
    attention_options_op.register_kernel("cpu", _host(
        lambda q, k, v, causal, scale, left, right, softcap, alibi: _attention(
            q, k, v, causal=causal, window=(left, right), scale=scale, softcap=softcap,
            alibi_slopes=alibi, return_lse=True)))
    attention_options_backward_op.register_kernel("cpu", _host(
        lambda do, q, k, v, o, lse, causal, scale, left, right, softcap, alibi:
        _backward.attention_backward(do, q, k, v, o, lse, causal=causal, window=(left, right),
                                     scale=scale, softcap=softcap, alibi_slopes=alibi)))


def attention(q, k, v, causal=False, scale=None, window=None, softcap=None, alibi_slopes=None):
    """Scaled dot-product attention O = softmax(scale·QKᵀ) V through the package's flash
    forward and backward, differentiable in q, k and v (``causal``: bottom-right aligned,
    PyTorch's ``is_causal`` for Sq == Sk; ``scale`` default 1/sqrt(D); ``window``: None or
    (left, right), ``softcap`` and ``alibi_slopes`` (a float32 tensor, (Hq,) or (B, Hq),
    not differentiated) as in :func:`numba_softmax.attention`).  K and V may have fewer
    heads than Q (grouped-query attention)."""
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _tensor(t, name, _ATTENTION_DTYPES)
    causal = _checks.flag(causal, "causal")
    if scale is not None:
        scale = _checks.scale(scale, q.shape[-1])
    left, right = _checks.window(window)
    softcap = _checks.softcap(softcap)
    if alibi_slopes is not None:
        _tensor(alibi_slopes, "alibi_slopes", (torch.float32,))
        alibi_slopes = alibi_slopes.detach()
    if (left, right) == (-1, -1) and not softcap and alibi_slopes is None:
        return attention_op(q, k, v, causal, scale)[0]
    return attention_options_op(q, k, v, causal, scale, left, right, softcap, alibi_slopes)[0]


from .torch_varlen import attention_varlen  # noqa: E402  (packed batches: their own module)
