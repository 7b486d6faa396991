"""Bad input at every public entry point: one row per (function, bad input).

Each row calls a public function with one thing wrong — a dtype, a shape, an array kind
or device, a stride the function cannot write through, a NaN or infinite parameter, an
integer out of range, a value of the wrong type — and expects a ``TypeError`` or
``ValueError`` whose message names the argument; the inputs (NumPy and device arrays
alike) must be unchanged afterwards.  Rows that fail today are marked ``xfail(strict)``
with what goes wrong, so they turn into errors the day they are fixed.
"""

from types import SimpleNamespace

import numpy as np
import pytest
from numba import cuda

import numba_softmax as ns


def inputs():
    """Small, valid inputs of every function (float32); each row spoils one thing."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    a = SimpleNamespace()
    a.x = f(3, 8)
    a.y = ns.reference.softmax(a.x).astype(np.float32)
    a.q, a.k, a.v = f(1, 2, 4, 8), f(1, 2, 4, 8), f(1, 2, 4, 8)
    a.o, a.lse = f(1, 2, 4, 8), f(1, 2, 4)
    a.o2, a.lse2 = f(1, 2, 4, 8), f(1, 2, 4)
    a.pq, a.pk, a.pv = f(6, 2, 8), f(6, 2, 8), f(6, 2, 8)  # packed: two sequences, 2 + 4
    a.cu = np.array([0, 2, 6], np.int32)
    a.dq = f(2, 4, 1, 8)  # paged: two sequences, blocks of 4
    a.kc, a.vc = f(5, 4, 2, 8), f(5, 4, 2, 8)
    a.table = np.array([[3, 1, -1], [0, 2, 4]], np.int32)
    a.lens = np.array([7, 9], np.int32)
    a.kn, a.vn = f(2, 1, 2, 8), f(2, 1, 2, 8)
    a.dkc, a.dvc = cuda.to_device(a.kc), cuda.to_device(a.vc)  # append_kv writes in place
    a.dkn, a.dvn = cuda.to_device(a.kn), cuda.to_device(a.vn)
    a.dev_x = cuda.to_device(a.x)
    return a


def _wide_out(a):
    """A device output whose rows alias each other (stride 0): not writable row by row."""
    base = cuda.to_device(np.zeros(8, np.float32))
    from numba_softmax.arrays import kinds

    return kinds.view_of(kinds.describe(base), (3, 8), (0, 4))


XF = pytest.mark.xfail


def xfail(reason):
    return XF(strict=True, reason=reason)


# (id, call(a), error, the argument's name in the message (a regular expression), marks)
ROWS = [
    # --- softmax, log_softmax, logsumexp (one entry code path: softmax and logsumexp here)
    ("softmax-int-dtype", lambda a: ns.softmax(a.x.astype(np.int32)), TypeError, r"\bx\b"),
    ("softmax-complex", lambda a: ns.softmax(a.x.astype(np.complex64)), TypeError, r"\bx\b"),
    ("softmax-axis-out-of-range", lambda a: ns.softmax(a.x, axis=2), ValueError, "axis"),
    ("softmax-axis-float", lambda a: ns.softmax(a.x, axis=1.0), TypeError, "axis"),
    ("softmax-method", lambda a: ns.softmax(a.x, method="bogus"), ValueError, "method"),
    ("softmax-out-shape", lambda a: ns.softmax(a.x, out=np.zeros((3, 7), np.float32)),
     ValueError, r"\bout\b"),
    ("softmax-out-dtype", lambda a: ns.softmax(a.x, out=np.zeros((3, 8), np.float64)),
     TypeError, r"\bout\b"),
    ("softmax-out-kind", lambda a: ns.softmax(a.x, out=cuda.device_array((3, 8), np.float32)),
     TypeError, r"\bout\b"),
    ("softmax-out-aliased-rows", lambda a: ns.softmax(a.dev_x, out=_wide_out(a)), ValueError,
     r"\bout\b"),
    ("softmax-not-an-array", lambda a: ns.softmax("logits"), TypeError, r"\bx\b"),
    ("log_softmax-axis", lambda a: ns.log_softmax(a.x, axis=-3), ValueError, "axis"),
    ("logsumexp-int-dtype", lambda a: ns.logsumexp(a.x.astype(np.int64)), TypeError, r"\bx\b"),
    # --- softmax_backward, log_softmax_backward
    ("softmax_backward-dtypes", lambda a: ns.softmax_backward(a.x.astype(np.float64), a.y),
     TypeError, r"\bdy\b|\by\b"),
    ("softmax_backward-shapes", lambda a: ns.softmax_backward(a.x[:, :7], a.y), ValueError,
     r"\bdy\b|\by\b"),
    ("softmax_backward-axis", lambda a: ns.softmax_backward(a.x, a.y, axis=2), ValueError,
     "axis"),
    ("softmax_backward-kinds", lambda a: ns.softmax_backward(a.dev_x, a.y), TypeError,
     r"\bdy\b|\by\b"),
    ("log_softmax_backward-int", lambda a: ns.log_softmax_backward(a.x, a.y.astype(np.int32)),
     TypeError, r"\by\b"),
    # --- attention
    ("attention-int-dtype", lambda a: ns.attention(a.q.astype(np.int32), a.k, a.v), TypeError,
     r"\bq\b"),
    ("attention-mixed-dtypes", lambda a: ns.attention(a.q, a.k.astype(np.float16), a.v),
     TypeError, r"\bk\b"),
    ("attention-rank-1", lambda a: ns.attention(a.q[0, 0, 0], a.k, a.v), ValueError, r"\bq\b"),
    ("attention-head-dim", lambda a: ns.attention(a.q, a.k[..., :4], a.v), ValueError, r"\bk\b"),
    ("attention-keys-v", lambda a: ns.attention(a.q, a.k, a.v[..., :3, :]), ValueError,
     r"\bv\b"),
    ("attention-kinds", lambda a: ns.attention(a.q, cuda.to_device(a.k), a.v), TypeError,
     r"\bk\b"),
    ("attention-scale-nan", lambda a: ns.attention(a.q, a.k, a.v, scale=float("nan")),
     TypeError, "scale"),
    ("attention-scale-inf", lambda a: ns.attention(a.q, a.k, a.v, scale=float("inf")),
     TypeError, "scale"),
    ("attention-scale-str", lambda a: ns.attention(a.q, a.k, a.v, scale="1"), TypeError,
     "scale"),
    ("attention-causal", lambda a: ns.attention(a.q, a.k, a.v, causal="yes"), TypeError,
     "causal"),
    ("attention-window-short", lambda a: ns.attention(a.q, a.k, a.v, window=(1,)), TypeError,
     "window"),
    ("attention-window-triple", lambda a: ns.attention(a.q, a.k, a.v, window=(1, 2, 3)),
     TypeError, "window"),
    ("attention-splits-zero", lambda a: ns.attention(a.q, a.k, a.v, num_splits=0), ValueError,
     "num_splits"),
    ("attention-splits-float", lambda a: ns.attention(a.q, a.k, a.v, num_splits=2.0),
     TypeError, "num_splits"),
    ("attention-out-shape", lambda a: ns.attention(a.q, a.k, a.v, out=np.zeros((1, 2, 4, 7),
                                                                              np.float32)),
     ValueError, r"\bout\b"),
    ("attention-lse-flag", lambda a: ns.attention(a.q, a.k, a.v, return_lse=1), TypeError,
     "return_lse"),
    # --- merge_attention
    ("merge-lse-shape", lambda a: ns.merge_attention(a.o, a.lse[..., :3], a.o2, a.lse2),
     ValueError, "lse_a"),
    ("merge-dtypes", lambda a: ns.merge_attention(a.o, a.lse, a.o2.astype(np.float16), a.lse2),
     TypeError, "o_b"),
    ("merge-int", lambda a: ns.merge_attention(a.o.astype(np.int32), a.lse, a.o2, a.lse2),
     TypeError, "o_a"),
    # --- attention_varlen
    ("varlen-cu-float", lambda a: ns.attention_varlen(a.pq, a.pk, a.pv, a.cu.astype(np.float32),
                                                      a.cu), TypeError, "cu_seqlens_q"),
    ("varlen-cu-decreasing", lambda a: ns.attention_varlen(a.pq, a.pk, a.pv,
                                                           np.array([0, 4, 2, 6], np.int32),
                                                           np.array([0, 2, 4, 6], np.int32)),
     ValueError, "cu_seqlens_q"),
    ("varlen-cu-past-the-end", lambda a: ns.attention_varlen(a.pq, a.pk, a.pv, a.cu,
                                                             np.array([0, 2, 9], np.int32)),
     ValueError, "cu_seqlens_k"),
    ("varlen-batches", lambda a: ns.attention_varlen(a.pq, a.pk, a.pv, a.cu, a.cu[:2]),
     ValueError, "cu_seqlens"),
    ("varlen-max-seqlen-small", lambda a: ns.attention_varlen(a.pq, a.pk, a.pv, a.cu, a.cu,
                                                              max_seqlen_q=3),
     ValueError, "max_seqlen_q"),
    ("varlen-max-seqlen-float", lambda a: ns.attention_varlen(a.pq, a.pk, a.pv, a.cu, a.cu,
                                                              max_seqlen_k=4.0),
     TypeError, "max_seqlen_k"),
    ("varlen-not-packed", lambda a: ns.attention_varlen(a.q, a.k, a.v, a.cu, a.cu), ValueError,
     r"\bq\b"),
    ("varlen-scale-nan", lambda a: ns.attention_varlen(a.pq, a.pk, a.pv, a.cu, a.cu,
                                                       scale=float("nan")), TypeError, "scale"),
    # --- paged_attention
    ("paged-table-int64", lambda a: ns.paged_attention(a.dq, a.kc, a.vc, a.table.astype(np.int64),
                                                       a.lens), TypeError, "block_table"),
    ("paged-seqlens-negative", lambda a: ns.paged_attention(a.dq, a.kc, a.vc, a.table,
                                                            np.array([-1, 9], np.int32)),
     ValueError, "cache_seqlens"),
    ("paged-block-outside", lambda a: ns.paged_attention(a.dq, a.kc, a.vc,
                                                         np.array([[3, 7, -1], [0, 2, 4]],
                                                                  np.int32), a.lens),
     ValueError, "block_table"),
    ("paged-table-outside-device", lambda a: ns.paged_attention(
        a.dq, a.kc, a.vc, cuda.to_device(np.array([[3, 7, -1], [0, 2, 4]], np.int32)),
        cuda.to_device(a.lens)), ValueError, "block_table"),
    ("paged-dtypes", lambda a: ns.paged_attention(a.dq, a.kc.astype(np.float16), a.vc, a.table,
                                                  a.lens), TypeError, "k_cache"),
    ("paged-batch", lambda a: ns.paged_attention(a.dq[:1], a.kc, a.vc, a.table, a.lens),
     ValueError, "block_table|batch"),
    ("paged-check-flag", lambda a: ns.paged_attention(a.dq, a.kc, a.vc, a.table, a.lens,
                                                      check="yes"), TypeError, "check"),
    ("paged-scale-inf", lambda a: ns.paged_attention(a.dq, a.kc, a.vc, a.table, a.lens,
                                                     scale=float("-inf")), TypeError, "scale"),
    ("paged-splits", lambda a: ns.paged_attention(a.dq, a.kc, a.vc, a.table, a.lens,
                                                  num_splits=-1), ValueError, "num_splits"),
    # --- append_kv (the caches are written: a refused call must leave them as they were)
    ("append-numpy-caches", lambda a: ns.append_kv(a.kn, a.vn, a.kc, a.vc, a.table, a.lens),
     TypeError, "k_cache"),
    ("append-kinds", lambda a: ns.append_kv(a.kn, a.vn, a.dkc, a.dvc, a.table, a.lens),
     TypeError, "k_new"),
    ("append-dtypes", lambda a: ns.append_kv(cuda.to_device(a.kn.astype(np.float16)), a.dvn,
                                             a.dkc, a.dvc, a.table, a.lens), TypeError, "k_new"),
    ("append-table-int64", lambda a: ns.append_kv(a.dkn, a.dvn, a.dkc, a.dvc,
                                                  a.table.astype(np.int64), a.lens),
     TypeError, "block_table"),
    ("append-past-the-row", lambda a: ns.append_kv(a.dkn, a.dvn, a.dkc, a.dvc, a.table,
                                                   np.array([7, 12], np.int32)),
     ValueError, "sequence 1|cache_seqlens"),
    ("append-new-shapes", lambda a: ns.append_kv(
        a.dkn, cuda.to_device(np.ascontiguousarray(a.vn[:, :, :1])), a.dkc, a.dvc, a.table,
        a.lens), ValueError, "v_new"),
    ("append-unused-slot", lambda a: ns.append_kv(a.dkn, a.dvn, a.dkc, a.dvc,
                                                  np.array([[3, 1, -1], [0, 2, 4]], np.int32),
                                                  np.array([8, 9], np.int32)),
     ValueError, "block_table"),
    # --- attention_backward
    ("backward-lse-shape", lambda a: ns.attention_backward(a.o2, a.q, a.k, a.v, a.o,
                                                           a.lse[..., :3]), ValueError, "lse"),
    ("backward-dtypes", lambda a: ns.attention_backward(a.o2.astype(np.float16), a.q, a.k, a.v,
                                                        a.o, a.lse), TypeError, r"\bdo\b"),
    ("backward-scale-nan", lambda a: ns.attention_backward(a.o2, a.q, a.k, a.v, a.o, a.lse,
                                                           scale=float("nan")),
     TypeError, "scale"),
    ("backward-window", lambda a: ns.attention_backward(a.o2, a.q, a.k, a.v, a.o, a.lse,
                                                        window=(0, 1.5)), TypeError, "window"),
    # --- softmax_topk
    ("topk-k-zero", lambda a: ns.softmax_topk(a.x, 0), ValueError, r"\bk\b"),
    ("topk-k-past-V", lambda a: ns.softmax_topk(a.x, 9), ValueError, r"\bk\b"),
    ("topk-k-float", lambda a: ns.softmax_topk(a.x, 2.0), TypeError, r"\bk\b"),
    ("topk-k-bool", lambda a: ns.softmax_topk(a.x, True), TypeError, r"\bk\b"),
    ("topk-temperature-nan", lambda a: ns.softmax_topk(a.x, 2, temperature=float("nan")),
     ValueError, "temperature"),
    ("topk-temperature-inf", lambda a: ns.softmax_topk(a.x, 2, temperature=float("inf")),
     ValueError, "temperature"),
    ("topk-temperature-zero", lambda a: ns.softmax_topk(a.x, 2, temperature=0.0), ValueError,
     "temperature"),
    ("topk-log", lambda a: ns.softmax_topk(a.x, 2, log="yes"), TypeError, r"\blog\b"),
    ("topk-axis", lambda a: ns.softmax_topk(a.x, 2, axis=2), ValueError, "axis"),
    ("topk-int-dtype", lambda a: ns.softmax_topk(a.x.astype(np.int32), 2), TypeError, r"\bx\b"),
    # --- sample
    ("sample-top-k-zero", lambda a: ns.sample(a.x, top_k=0), ValueError, "top_k"),
    ("sample-top-k-past-128", lambda a: ns.sample(np.zeros((1, 200), np.float32), top_k=129),
     ValueError, "top_k"),
    ("sample-top-p-nan", lambda a: ns.sample(a.x, top_k=2, top_p=float("nan")), ValueError,
     "top_p"),
    ("sample-top-p-zero", lambda a: ns.sample(a.x, top_k=2, top_p=0.0), ValueError, "top_p"),
    ("sample-temperature-inf", lambda a: ns.sample(a.x, temperature=float("inf")), ValueError,
     "temperature"),
    ("sample-temperature-negative", lambda a: ns.sample(a.x, temperature=-1.0), ValueError,
     "temperature"),
    ("sample-seed-float", lambda a: ns.sample(a.x, seed=1.5), TypeError, "seed"),
    ("sample-seed-str", lambda a: ns.sample(a.x, seed="7"), TypeError, "seed"),
    ("sample-axis", lambda a: ns.sample(a.x, axis=-3), ValueError, "axis"),
    ("sample-int-dtype", lambda a: ns.sample(a.x.astype(np.int16)), TypeError, "logits"),
]


def snapshot(a):
    """Copies of every array the rows may pass (host copies of device arrays)."""
    return {n: (x.copy_to_host() if hasattr(x, "copy_to_host") else np.array(x))
            for n, x in vars(a).items()}


@pytest.mark.parametrize("call, error, name", [pytest.param(*r[1:4], id=r[0], marks=r[4:])
                                               for r in ROWS])
def test_bad_input_is_refused_by_name_and_inputs_are_left_alone(call, error, name):
    a = inputs()
    before = snapshot(a)
    with pytest.raises(error, match=name):
        call(a)
    after = snapshot(a)
    for n in before:
        np.testing.assert_array_equal(after[n], before[n], err_msg=f"input {n} was modified")


# --- ring_attention and the torch ops (where torch is installed) ---------------------------
TORCH_ROWS = [
    ("ring-numpy", lambda t, a: ns.ring_attention(a.q, a.k, a.v), TypeError, r"\bq\b"),
    ("ring-int", lambda t, a: ns.ring_attention(*(t.zeros(1, 4, 8, dtype=t.int32),) * 3),
     TypeError, r"\bq\b"),
    ("ring-float64", lambda t, a: ns.ring_attention(*(t.zeros(1, 4, 8, dtype=t.float64),) * 3),
     TypeError, r"\bq\b"),
    ("ring-rank-1", lambda t, a: ns.ring_attention(*(t.zeros(8),) * 3), ValueError, r"\bq\b"),
    ("ring-shards", lambda t, a: ns.ring_attention(t.zeros(1, 4, 8), t.zeros(1, 3, 8),
                                                   t.zeros(1, 3, 8)), ValueError, "shards|q"),
    ("torch-softmax-numpy", lambda t, a: _nt().softmax(a.x), TypeError, r"\bx\b"),
    ("torch-softmax-dim", lambda t, a: _nt().softmax(t.zeros(3, 8), dim=2),
     (ValueError, IndexError), "dim"),
    ("torch-attention-int", lambda t, a: _nt().attention(*(t.zeros(1, 4, 8, dtype=t.int32),) * 3),
     TypeError, r"\bq\b"),
    ("torch-attention-scale-nan", lambda t, a: _nt().attention(*(t.zeros(1, 4, 8),) * 3,
                                                               scale=float("nan")),
     TypeError, "scale"),
]


def _nt():
    from numba_softmax import torch as nt

    return nt


@pytest.mark.parametrize("call, error, name", [pytest.param(*r[1:4], id=r[0], marks=r[4:])
                                               for r in TORCH_ROWS])
def test_torch_entry_points_refuse_bad_input(call, error, name):
    torch = pytest.importorskip("torch")
    a = inputs()
    with pytest.raises(error, match=name):
        call(torch, a)
