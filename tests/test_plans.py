"""Launch plans (GPU only): a repeat call replays its recorded launches, never a stale one.

Hits and misses for every entry point and array kind, with and without ``out=``; a
changed dtype, stride, stream or overlap never replays a plan made for another; replayed
results equal the ordinary path's; concurrent calls from threads; a side stream orders
after the work queued on it."""

import threading

import numpy as np
import pytest

import numba_softmax as ns
from numba_softmax import plans

from _helpers import SIMULATOR, device_kinds, to_host

pytestmark = pytest.mark.skipif(SIMULATOR, reason="launch plans exist on a GPU only")
KINDS = [k for k in device_kinds()]


def make(kind, host):
    if kind == "torch":
        import torch

        return torch.from_numpy(host).cuda()
    if kind == "cupy":
        import cupy

        return cupy.asarray(host)
    from numba import cuda

    return cuda.to_device(host)


def empty(kind, shape, like):
    if kind == "torch":
        import torch

        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if kind == "cupy":
        import cupy

        return cupy.empty(shape, dtype=like.dtype)
    from numba import cuda

    return cuda.device_array(shape, dtype=like.dtype)


def fresh(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def calls():
    """(name, function of (kind, seed) → (result, expected))."""
    def sm(kind, seed, out=False):
        h = fresh((37, 760), seed)
        x = make(kind, h)
        o = empty(kind, h.shape, x) if out else None
        r = ns.softmax(x, out=o)
        return r, ns.reference.softmax(h.astype(np.float64)), (o is None or r is o)

    def lse(kind, seed):
        h = fresh((5, 7, 33), seed)
        return ns.logsumexp(make(kind, h), axis=1), ns.reference.logsumexp(
            np.moveaxis(h, 1, -1).astype(np.float64)), True

    def att(kind, seed):
        q, k, v = (fresh((2, 3, 17, 16), seed + i) for i in range(3))
        o = ns.attention(make(kind, q), make(kind, k), make(kind, v), causal=True)
        return o, ns.reference.attention(q, k, v, causal=True), True

    def merge(kind, seed):
        oa, ob = fresh((2, 9, 8), seed), fresh((2, 9, 8), seed + 1)
        la, lb = fresh((2, 9), seed + 2), fresh((2, 9), seed + 3)
        o, _ = ns.merge_attention(*(make(kind, a) for a in (oa, la, ob, lb)))
        return o, ns.reference.merge_attention(oa, la, ob, lb)[0], True

    def paged(kind, seed):
        q, kc, vc, table, lens = paged_data(seed)
        o = ns.paged_attention(*(make(kind, a) for a in (q, kc, vc, table, lens)))
        return o, ns.reference.paged_attention(*(a.astype(np.float64) for a in (q, kc, vc)),
                                               table, lens), True

    return {"softmax": sm, "softmax_out": lambda k, s: sm(k, s, out=True), "logsumexp": lse,
            "attention": att, "merge_attention": merge, "paged_attention": paged}


def paged_data(seed, blocks=8, bs=4):
    """q (2, 4, 1, 16), caches of ``blocks`` blocks, a shuffled table (2, 3), lengths."""
    rng = np.random.default_rng(seed)
    kc, vc = fresh((blocks, bs, 2, 16), seed), fresh((blocks, bs, 2, 16), seed + 1)
    table = rng.permutation(blocks)[:6].reshape(2, 3).astype(np.int32)
    return fresh((2, 4, 1, 16), seed + 2), kc, vc, table, np.array([9, 11], np.int32)


@pytest.mark.parametrize("kind", KINDS)
def test_paged_plan_still_checks_each_new_table(kind):
    """A replayed paged call checks the new table's contents (layouts alone were checked
    when it was recorded); check=False replays without waiting and reads in bounds."""
    q, kc, vc, table, lens = (make(kind, a) for a in paged_data(0))
    ns.paged_attention(q, kc, vc, table, lens)  # records
    bad = paged_data(0)[3]
    bad[1, 2] = 99
    with pytest.raises(ValueError, match=r"block_table\[1, 2\] = 99"):
        ns.paged_attention(q, kc, vc, make(kind, bad), lens)
    o = ns.paged_attention(q, kc, vc, make(kind, bad), lens, check=False)
    assert np.isfinite(to_host(o)).all()
    for seed in (1, 2):  # the check's findings are read anew: a good table passes again
        q, kc, vc, table, lens = paged_data(seed)
        o = ns.paged_attention(*(make(kind, a) for a in (q, kc, vc, table, lens)))
        want = ns.reference.paged_attention(*(a.astype(np.float64) for a in (q, kc, vc)),
                                            table, lens)
        np.testing.assert_allclose(to_host(o), want, rtol=2e-5, atol=2e-6)
    long = np.array([9, 13], np.int32)  # beyond the table row: the lengths' finding
    with pytest.raises(ValueError, match="sequence 1 needs 13 positions"):
        ns.paged_attention(q, kc, vc, make(kind, table), make(kind, long))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(calls()))
def test_repeat_calls_hit_a_plan_and_see_new_data(kind, name):
    fn = calls()[name]
    plans._PLANS.clear()  # (another test in this process may have recorded the same call)
    for seed in range(3):  # the first call records, the next two replay with new data
        got, want, same_out = fn(kind, seed)
        np.testing.assert_allclose(to_host(got), want, rtol=2e-5, atol=2e-6)
        assert same_out
    assert plans.enabled() and len(plans._PLANS) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_changed_layout_never_replays_a_stale_plan(kind):
    """Same shapes, other strides / dtype / rows, interleaved: each needs its own plan."""
    variants = [lambda h: h, lambda h: h[:, ::2], lambda h: h.T, lambda h: h[:8],
                lambda h: h[1:]]  # h[1:]: the same layout 256 bytes on (alignment kept)
    for seed in range(2):
        for dtype in (np.float32, np.float64):
            base = fresh((16, 64), seed, dtype)
            dev = make(kind, base)
            for v in variants:
                got = to_host(ns.softmax(v(dev)))
                np.testing.assert_allclose(got, ns.reference.softmax(np.asarray(v(base), np.float64)),
                                           rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_in_place_then_apart_then_in_place(kind):
    h = fresh((4, 100), 3)
    x = make(kind, h)
    ns.softmax(x, out=x)  # in place records one plan …
    np.testing.assert_allclose(to_host(x), ns.reference.softmax(h.astype(np.float64)), rtol=2e-5)
    y = make(kind, h)
    o = empty(kind, h.shape, y)
    ns.softmax(y, out=o)  # … and out= apart another: same layouts, other overlap
    np.testing.assert_allclose(to_host(o), ns.reference.softmax(h.astype(np.float64)), rtol=2e-5)
    np.testing.assert_array_equal(to_host(y), h)


def test_threads_replaying_at_once():
    kind = KINDS[-1]
    hosts = [fresh((64, 512), s) for s in range(8)]
    xs = [make(kind, h) for h in hosts]
    ns.softmax(xs[0])  # record
    results, errors = [None] * 8, []

    def work(i):
        try:
            for _ in range(20):
                results[i] = to_host(ns.softmax(xs[i]))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    for r, h in zip(results, hosts):
        np.testing.assert_allclose(r, ns.reference.softmax(h.astype(np.float64)), rtol=2e-5, atol=2e-6)


def test_a_new_thread_is_never_replayed_into_no_context():
    """A thread's first call finds no current CUDA context (Numba makes one current when
    it first launches there): such a call must take the ordinary path, not replay a plan
    — and never record one that a later new thread would replay without a context."""
    kind = KINDS[-1]
    h = fresh((5, 300), 11)
    x = make(kind, h)
    ns.softmax(x)  # recorded in this thread
    results, errors = [], []

    def first_call():
        try:
            results.append(to_host(ns.softmax(x)))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    for _ in range(3):
        t = threading.Thread(target=first_call)
        t.start()
        t.join()
    assert not errors
    for r in results:
        np.testing.assert_allclose(r, ns.reference.softmax(h.astype(np.float64)), rtol=2e-5, atol=2e-6)


def test_side_stream_orders_after_its_own_work():
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    h = fresh((256, 4096), 5)
    for _ in range(3):  # record, then replay
        with torch.cuda.stream(s):
            x = torch.from_numpy(h).cuda(non_blocking=False)
            x.mul_(2.0)  # queued on s; the softmax must see it
            y = ns.softmax(x, stream=torch.cuda.current_stream())
        s.synchronize()
        np.testing.assert_allclose(y.cpu().numpy(), ns.reference.softmax(2.0 * h.astype(np.float64)),
                                   rtol=2e-5, atol=2e-6)
