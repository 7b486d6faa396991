"""Ring attention, measured: each step's times, the predicted P-GPU time, the error rule.

Shared by ``examples/10_ring_attention.py`` and ``scripts/experiments/ring.py``.

* :class:`StepTimer` is a ring hook (``hook=``): it stamps every phase of every step —
  ``begin``, ``computed`` (the partial (O, LSE) is in hand), ``merged``, ``received`` —
  with a CUDA event on the current torch stream (or the wall clock on the simulator).
  On one stream the difference of two stamps is the device time of the work between them:
  attention = computed − begin, merge = merged − computed, exposed communication =
  received − merged (how long the stream waited for the next K/V after its own work).
* :func:`predict` turns the steps of an in-process ring on one GPU into the time of a ring
  of P GPUs: the ranks work in lockstep, so a step lasts as long as its slowest rank, or as
  long as the transfer of a K/V shard if that is longer (perfect overlap).
* :func:`reference_rows`, :func:`row_errors` and :func:`flash_attn_rule`: the check of a ring's output on a
  sample of query rows — the float64 reference, and the same computation in the input
  precision as PyTorch would do it (flash-attn's rule: error ≤ 2 × that one's + 1e-5).
"""

import time

__all__ = ["StepTimer", "seconds", "predict", "reference_rows", "row_errors", "flash_attn_rule"]


class StepTimer:
    """A ring hook that stamps every phase of every (step, rank); ``cuda``: CUDA events on
    the current torch stream, else the wall clock (simulator: Python threads' time)."""

    def __init__(self, cuda=True):
        self.cuda = cuda
        self.stamps = {}  # (t, rank, phase) → event or seconds

    def __call__(self, phase, st, arrays):
        if self.cuda:
            import torch

            stamp = torch.cuda.Event(enable_timing=True)
            stamp.record()
        else:
            stamp = time.perf_counter()
        self.stamps[(st.t, st.rank, phase)] = stamp

    def _seconds(self, a, b):
        if a is None or b is None:
            return 0.0
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def steps(self):
        """{(t, rank): (attention s, merge s, exposed communication s)}; call after the
        device has finished (``torch.cuda.synchronize()``)."""
        out = {}
        for t, r in sorted({(t, r) for t, r, _ in self.stamps}):
            get = lambda phase: self.stamps.get((t, r, phase))  # noqa: E731
            computed = get("computed") or get("begin")  # a step with nothing to compute
            merged = get("merged") or computed
            out[(t, r)] = (self._seconds(get("begin"), computed),
                           self._seconds(computed, merged),
                           self._seconds(merged, get("received")))
        return out


def seconds(fn, cuda=True):
    """(fn(), seconds it took): CUDA events on the current torch stream after a
    synchronisation, or the wall clock."""
    if not cuda:
        t0 = time.perf_counter()
        return fn(), time.perf_counter() - t0
    import torch

    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    out = fn()
    b.record()
    b.synchronize()
    return out, a.elapsed_time(b) / 1e3


def predict(steps, world, transfer_s=0.0):
    """The time of a ring of ``world`` devices from the per-(step, rank) times of
    :meth:`StepTimer.steps` (taken one rank after another on one device): Σ over steps of
    max(slowest rank's attention + merge, ``transfer_s`` for the steps that wait on a
    transfer — all but the last)."""
    total = 0.0
    for t in range(world):
        work = max(a + m for (tt, _), (a, m, _) in steps.items() if tt == t)
        total += max(work, transfer_s if t + 1 < world else 0.0)
    return total


def reference_rows(q, k, v, rows, *, causal, scale, dtype, block=64):
    """Attention of query rows ``rows`` (positions in the whole sequence) of the torch
    tensors q, k, v (..., S, D), computed in ``dtype``: float64 for the reference, the
    input dtype for PyTorch's same-precision error (scores in ``dtype``, softmax in
    float32, P rounded to ``dtype``, as flash-attn's ``attention_ref``).  Chunked over
    ``block`` rows: never more than block × S scores."""
    import torch

    out = []
    kk, vv = k.to(dtype), v.to(dtype)
    for i in range(0, len(rows), block):
        idx = torch.as_tensor(rows[i:i + block], device=q.device)
        s = (q[..., idx, :].to(dtype) * scale) @ kk.transpose(-1, -2)
        if causal:
            keys = torch.arange(k.shape[-2], device=q.device)
            s = s.masked_fill(keys[None, :] > idx[:, None], float("-inf"))
        p = torch.softmax(s.to(torch.float64 if dtype == torch.float64 else torch.float32), -1)
        out.append(p.to(dtype) @ vv)
    return torch.cat(out, dim=-2)


def row_errors(q, k, v, rows, outputs, *, causal, scale):
    """max |O − O_fp64| on query ``rows`` (a tensor of positions) of each whole-sequence
    output in ``outputs``, then of PyTorch in the input precision."""
    import torch

    ref = reference_rows(q, k, v, rows, causal=causal, scale=scale, dtype=torch.float64)
    same = reference_rows(q, k, v, rows, causal=causal, scale=scale, dtype=q.dtype)
    gap = lambda x: float((x.double() - ref).abs().max())  # noqa: E731
    return [gap(o[..., rows, :]) for o in outputs] + [gap(same)]


def flash_attn_rule(err, err_same_precision):
    """flash-attn's acceptance rule: the error against the float64 reference at most twice
    PyTorch's same-precision error, plus 1e-5."""
    return err <= 2 * err_same_precision + 1e-5
