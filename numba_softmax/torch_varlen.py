"""PyTorch integration, packed batches: ``attention_varlen`` with autograd, for training.

    import numba_softmax.torch as nst
    o = nst.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True)
    o.sum().backward()                     # dq, dk, dv on the packed tensors

q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv) hold the sequences one after
another; sequence b owns rows cu[b] … cu[b+1] − 1 (int32 offsets, flash-attn's layout).
The forward is :func:`numba_softmax.attention_varlen` — one launch for the whole batch.
The backward runs :func:`numba_softmax.attention_backward` once per sequence, on views of
the packed tensors (B launches: a packed backward kernel is still to come); rows of no
sequence get zero gradients.  Like :func:`numba_softmax.torch.attention` the pair is a
``torch.library`` custom op (``numba_softmax::attention_varlen``) with fake
implementations, so ``torch.compile`` traces around it; on the CUDA simulator it also takes
CPU tensors, through NumPy.  Imported by :mod:`numba_softmax.torch`, which exports
:func:`attention_varlen`.
"""

from typing import Optional

import numpy as np
import torch

from . import backward as _backward
from . import checks as _checks
from .inference import attention_varlen as _attention_varlen
from .runtime.sim import simulator_enabled as _simulating

__all__ = ["attention_varlen"]

_LIB = "numba_softmax"


def _stream(t):
    """The current stream of a CUDA tensor's device (None for the simulator's arrays)."""
    return torch.cuda.current_stream(t.device) if isinstance(t, torch.Tensor) and t.is_cuda \
        else None


@torch.library.custom_op(f"{_LIB}::attention_varlen", mutates_args=(), device_types="cuda")
def attention_varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                        cu_k: torch.Tensor, causal: bool, scale: Optional[float], left: int,
                        right: int, softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _attention_varlen(q, k, v, cu_q, cu_k, causal=causal, window=(left, right),
                             scale=scale, softcap=softcap, return_lse=True, stream=_stream(q))


def _grads(do, q, k, v, o, lse, cu_q, cu_k, causal, scale, left, right, softcap, zeros):
    """(dq, dk, dv) of the packed batch: :func:`numba_softmax.attention_backward` on each
    sequence's (1, H, S, D) view of the packed (total, H, D) arrays (torch tensors, or NumPy
    arrays on the simulator); ``zeros`` makes a zero array like its argument."""
    cq, ck = [int(x) for x in cu_q], [int(x) for x in cu_k]
    dq, dk, dv = zeros(q), zeros(k), zeros(v)

    def four(x, a, z):  # rows a … z − 1 of a (total, H, ·) array, as (1, H, z − a, ·)
        return x[a:z].swapaxes(0, 1)[None]

    for b in range(len(cq) - 1):
        (q0, q1), (k0, k1) = cq[b:b + 2], ck[b:b + 2]
        if q1 == q0 or k1 == k0:  # no queries, or no key to see: no gradient
            continue
        g = _backward.attention_backward(four(do, q0, q1), four(q, q0, q1), four(k, k0, k1),
                                         four(v, k0, k1), four(o, q0, q1), lse[None, :, q0:q1],
                                         causal=causal, window=(left, right), scale=scale,
                                         softcap=softcap, stream=_stream(q))
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = (x[0].swapaxes(0, 1) for x in g)
    return dq, dk, dv


@torch.library.custom_op(f"{_LIB}::attention_varlen_backward", mutates_args=(),
                         device_types="cuda")
def attention_varlen_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                                 v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                                 cu_q: torch.Tensor, cu_k: torch.Tensor, causal: bool,
                                 scale: Optional[float], left: int, right: int, softcap: float
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _grads(do, q, k, v, o, lse, cu_q.tolist(), cu_k.tolist(), causal, scale, left, right,
                  softcap, torch.zeros_like)


@attention_varlen_op.register_fake
def _(q, k, v, cu_q, cu_k, *_):
    return (q.new_empty(q.shape[:-1] + v.shape[-1:]),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


@attention_varlen_backward_op.register_fake
def _(do, q, k, v, *_):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *ctx.options = inputs  # causal, scale, left, right, softcap
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)


def _grad(ctx, do, _dlse):
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = attention_varlen_backward_op(do, q, k, v, o, lse, cu_q, cu_k, *ctx.options)
    return (dq, dk, dv, None, None) + (None,) * len(ctx.options)


attention_varlen_op.register_autograd(_grad, setup_context=_setup)


def _numpy(x):
    return x.detach().contiguous().numpy() if isinstance(x, torch.Tensor) else x


if _simulating():  # CPU tensors through NumPy, as numba_softmax.torch's attention ops
    attention_varlen_op.register_kernel("cpu", lambda q, k, v, cu_q, cu_k, causal, scale, left,
                                        right, softcap: tuple(
        torch.from_numpy(np.array(x)) for x in _attention_varlen(
            *(_numpy(t) for t in (q, k, v, cu_q, cu_k)), causal=causal, window=(left, right),
            scale=scale, softcap=softcap, return_lse=True)))
    attention_varlen_backward_op.register_kernel("cpu", lambda do, q, k, v, o, lse, cu_q, cu_k,
                                                 *opts: tuple(
        torch.from_numpy(np.ascontiguousarray(x)) for x in _grads(
            *(_numpy(t) for t in (do, q, k, v, o, lse)), cu_q.tolist(), cu_k.tolist(), *opts,
            np.zeros_like)))


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None, window=None,
                     softcap=None):
    """:func:`numba_softmax.attention_varlen` on torch tensors, differentiable in q, k and v
    (``cu_seqlens_q``, ``cu_seqlens_k``: int32 tensors of B + 1 offsets, on q's device)."""
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.float16, torch.bfloat16,
                                                               torch.float32):
            raise TypeError(f"{name} must be a float16, bfloat16 or float32 torch.Tensor")
    for t, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1:
            raise TypeError(f"{name} must be a 1-D int32 torch.Tensor of offsets")
    causal = _checks.flag(causal, "causal")
    if scale is not None:
        scale = _checks.scale(scale, q.shape[-1])
    left, right = _checks.window(window)
    softcap = _checks.softcap(softcap)
    return attention_varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, left, right,
                               softcap)[0]
