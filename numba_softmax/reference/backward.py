"""Backward passes in pure NumPy, float64: the gradients of softmax, log_softmax and attention.

Given the forward's *output* and the gradient dL/d(output), each function returns
dL/d(input) — what an autograd engine asks of a backward.  They are the twins of
:mod:`numba_softmax.kernels.backward.softmax_backward` and :mod:`numba_softmax.kernels.backward.attention_backward`
and the oracles of their tests (themselves checked against central finite differences)::

    softmax      y = softmax(x)          dx = y ∘ (dy − Σ y∘dy)
    log_softmax  y = log_softmax(x)      dx = dy − exp(y) ∘ Σ dy
    attention    O = softmax(scale·QKᵀ + mask) V, LSE its row log-sum-exp:
                 D  = rowsum(dO ∘ O)
                 P  = exp(scale·QKᵀ − LSE)            (masked keys: 0)
                 dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − D)
                 dQ = scale·dS K,   dK = scale·dSᵀ Q
                 softcap c: S = c·tanh(scale·QKᵀ / c), so dS is multiplied by 1 − tanh²
                 (ALiBi's bias is a constant: no change, and no gradient for the slopes)

Why the backward needs only LSE from the forward, and where dS = P ∘ (dP − D) comes from:
``docs/algorithms/backward.md``.
"""

import math

import numpy as np

from ..combine import weight_np
from .attention import scores, visible

__all__ = ["softmax_backward", "log_softmax_backward", "attention_backward"]


def softmax_backward(dy, y, axis=-1):
    """dx = y ∘ (dy − Σ y∘dy) along ``axis``: the vector–Jacobian product of softmax, whose
    Jacobian is diag(y) − y yᵀ."""
    dy, y = np.asarray(dy, np.float64), np.asarray(y, np.float64)
    return y * (dy - (y * dy).sum(axis=axis, keepdims=True))


def log_softmax_backward(dy, y, axis=-1):
    """dx = dy − exp(y) ∘ Σ dy along ``axis`` (y = log p, so exp(y) = p); the Jacobian of
    log_softmax is I − 1 pᵀ."""
    dy, y = np.asarray(dy, np.float64), np.asarray(y, np.float64)
    return dy - np.exp(y) * dy.sum(axis=axis, keepdims=True)


def attention_backward(do, q, k, v, o, lse, causal=False, scale=None, window=(-1, -1),
                       softcap=0.0, alibi_slopes=None):
    """(dQ, dK, dV) of O = attention(Q, K, V) from the forward's O and LSE.

    Shapes: q, o, do (..., Hq, Sq, D|Dv); k, v (..., Hkv, Sk, D|Dv) with Hq a multiple of Hkv
    (grouped-query attention: query head h reads key/value head h // (Hq/Hkv), so dK and dV
    sum over each group); lse (..., Hq, Sq).  ``causal`` and ``window`` as in
    :func:`numba_softmax.reference.visible`.  A row that saw no key (LSE = −inf) has P = 0:
    its dQ and its share of dK, dV are 0, never NaN.  ``softcap``, ``alibi_slopes``: as
    the forward's (:func:`numba_softmax.reference.scores`).
    """
    do, q, k, v, o, lse = (np.asarray(a, np.float64) for a in (do, q, k, v, o, lse))
    sq, sk = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    group = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    kr, vr = k, v
    if group > 1:  # one K, V per query head
        kr, vr = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)

    s = scores(q, kr, scale, softcap, alibi_slopes)
    s = np.where(visible(sq, sk, causal, window), s, -np.inf)
    empty = np.isneginf(lse)[..., None]  # the row saw no key: LSE = −inf, P = 0
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.where(empty, 0.0, weight_np(s, np.where(empty, 0.0, lse[..., None])))
    d = (do * o).sum(axis=-1, keepdims=True)  # D = rowsum(dO ∘ O)
    dv = np.swapaxes(p, -1, -2) @ do  # dV = Pᵀ dO
    dp = do @ np.swapaxes(vr, -1, -2)  # dP = dO Vᵀ
    ds = p * (dp - d)  # dS = P ∘ (dP − D)
    if softcap:  # through c·tanh(x / c): times 1 − tanh²(x / c), x = scale·q·k
        ds = ds * (1.0 - np.tanh(scale * (q @ np.swapaxes(kr, -1, -2)) / softcap) ** 2)
    dq = scale * (ds @ kr)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)
    if group > 1:  # each K/V head collects the gradients of its group of query heads
        shape = k.shape[:-3] + (k.shape[-3], group) + dk.shape[-2:]
        dk = dk.reshape(shape).sum(axis=-3)
        dv = dv.reshape(shape[:-1] + dv.shape[-1:]).sum(axis=-3)
    return dq, dk, dv
