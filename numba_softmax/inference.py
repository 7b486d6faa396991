"""Attention as inference engines call it: packed variable-length batches, a paged KV cache.

* :func:`attention_varlen` — flash-attn's ``flash_attn_varlen_func``: q (total_q, Hq, D),
  k/v (total_k, Hkv, ·) packed, sequence b owning the rows ``cu_seqlens[b]:cu_seqlens[b+1]``;
* :func:`paged_attention` — flash-attn's ``flash_attn_with_kvcache`` layout: q (B, Hq, Sq, D)
  over caches (num_blocks, block_size, Hkv, D) read through a block table;
* :func:`append_kv` — writes new tokens into their cache blocks.

Each call: validate (shapes, dtypes, and the tables — on the host for NumPy ones, by a
small kernel for device ones: a bad block id or length is a ``ValueError``, never a read
out of bounds) → device views (:mod:`.arrays`) →
kernel (:mod:`.kernels.attention.attention` / :mod:`.kernels.attention.attention_tc` for varlen,
:mod:`.kernels.decode.paged`, :mod:`.kernels.decode.append`) → results in the caller's kind.
"""

import numpy as np

from . import block_tables, checks, plans
from .arrays import heads, kinds, layout, ops
from .arrays.rows import check_dtype
from .attention import kernel_for
from .kernels.decode import append as _append
from .kernels.decode import paged as _paged
from .kernels.decode import table_check as _table_check

__all__ = ["attention_varlen", "paged_attention", "append_kv"]
F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)


def _ints(d, name, stream):
    """A described int32 index array (shapes checked by the caller) as a device view."""
    check_dtype(d, name, (I32,))
    if d.on_host:
        return ops.to_device(np.ascontiguousarray(d.obj), stream)
    if min(d.strides or (0,)) < 0 or layout.fold_rows(d.shape + (1,), d.strides + (1,), d.ndim) is None:
        raise ValueError(f"{name} must be a plain (non-negative stride) array")
    return kinds.view_of(d)


def _packed(d, stream):
    """A packed (total, H, D) array as the (1, H, total, D) view the kernels read."""
    total, h, e = d.shape
    if min(d.strides) < 0:  # a negative stride: one contiguous device copy first
        buf, dev = ops.empty(d.kind, d.shape, d.dtype, like=d.obj, stream=stream)
        layout.device_copy(d, d.shape, d.strides, kinds.describe(buf), kinds.c_strides(d.shape), stream)
        d = kinds.describe(buf)
    if d.on_host:
        dev = ops.to_device(np.ascontiguousarray(d.obj), stream)
        d = kinds.describe(dev)
    st = d.strides
    return kinds.view_of(d, (1, h, total, e), (0, st[1], st[0], st[2]))


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                     *, causal=False, window=None, scale=None, softcap=None, alibi_slopes=None,
                     return_lse=False, stream=None):
    """Attention over a packed batch of sequences of different lengths.

    q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv), one kind and dtype
    (float16, bfloat16, float32); ``cu_seqlens_q``, ``cu_seqlens_k``: int32 offsets
    (B + 1 values, from 0, non-decreasing) — sequence b's queries are the rows
    cu_seqlens_q[b] … cu_seqlens_q[b+1] − 1 and it attends only to its own keys, with
    ``causal`` and ``window`` aligned bottom-right inside the sequence (as
    :func:`numba_softmax.attention`); rows after cu_seqlens_q[-1] (padding) belong to no
    sequence and get O = 0, LSE = −inf.  ``max_seqlen_q``/``max_seqlen_k``: the longest
    sequences (integers, checked; computed when None).  ``softcap``, ``alibi_slopes``
    ((Hq,) or (B, Hq), row b for sequence b): as :func:`numba_softmax.attention`.  Returns O (total_q, Hq, Dv), and with
    ``return_lse`` LSE (Hq, total_q) float32 (flash-attn's layout).
    """
    stream = ops.as_stream(stream)
    dq, dk, dv = checks.packed_qkv(q, k, v)
    (tq, hq, d), (tk, _, _), (_, _, d_v) = dq.shape, dk.shape, dv.shape
    causal, return_lse = checks.flag(causal, "causal"), checks.flag(return_lse, "return_lse")
    window, scale = checks.window(window), checks.scale(scale, d)
    dcu_q, cu_q = checks.offsets(cu_seqlens_q, tq, "cu_seqlens_q")
    dcu_k, cu_k = checks.offsets(cu_seqlens_k, tk, "cu_seqlens_k")
    if cu_q.size != cu_k.size:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k need one batch, got {cu_q.size - 1} and {cu_k.size - 1}")
    longest_q, longest_k = int(np.diff(cu_q).max()), int(np.diff(cu_k).max())
    checks.max_seqlen(max_seqlen_q, longest_q, "max_seqlen_q")
    checks.max_seqlen(max_seqlen_k, longest_k, "max_seqlen_k")
    softcap = checks.softcap(softcap)
    slopes = checks.alibi_slopes(alibi_slopes, (cu_q.size - 1, hq))
    kernel = kernel_for(dq.dtype, scale)
    kernel.check_head_dims(d, d_v)
    kind = dq.kind
    if cu_q[-1] < tq:  # rows of no sequence (padding): O = 0, LSE = −inf, as the reference
        on_device = "numba" if kind == "numpy" else kind
        o_buf = ops.full(on_device, (tq, hq, d_v), 0.0, dq.dtype, like=q)
        lse_buf = ops.full(on_device, (hq, tq), -np.inf, F32, like=q)
    else:
        o_buf, _ = ops.empty(kind, (tq, hq, d_v), dq.dtype, like=q, stream=stream)
        lse_buf, _ = ops.empty(kind, (hq, tq), F32, like=q, stream=stream)
    if tq and hq and d_v:
        q4, k4, v4 = (_packed(x, stream) for x in (dq, dk, dv))
        o4 = kinds.view_of(kinds.describe(o_buf), (1, hq, tq, d_v), (0, d_v, hq * d_v, 1))
        lse3 = kinds.view_of(kinds.describe(lse_buf), (1, hq, tq), (0, tq, 1))
        cq = _ints(dcu_q, "cu_seqlens_q", stream)
        ck = _ints(dcu_k, "cu_seqlens_k", stream)
        kernel.launch(q4, k4, v4, o4, lse3, causal=causal, window=window, scale=scale,
                      cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(longest_q, 1),
                      stream=stream, small=plans.simulator_enabled(), softcap=softcap,
                      alibi=None if slopes is None else ops.to_device(slopes, stream))
    o = ops.to_user(kind, o_buf, stream, dq.dtype)
    return (o, ops.to_user(kind, lse_buf, stream)) if return_lse else o


def _cache_views(named, stream):
    """Device views of 4-D arrays (caches, new tokens) with non-negative strides."""
    out = []
    for name, d in named:
        if d.ndim != 4:
            raise ValueError(f"{name} must be 4-D, got shape {d.shape}")
        if d.on_host:
            out.append(ops.to_device(np.ascontiguousarray(d.obj), stream))
        elif min(d.strides) < 0:
            raise ValueError(f"{name} has a negative stride; pass a plain view")
        else:
            out.append(kinds.view_of(d))
    return out


def _tables(dtable, dlens, n_blocks, block_size, batch, stream, new_tokens=0, check=True,
            queue=False):
    """Device views of the (described) block table and lengths, checked
    (:func:`.block_tables.tables`: NumPy tables on the host before they are copied, device ones
    by a kernel).  ``queue``: a device table's check is only queued on ``stream``
    (:func:`.kernels.decode.table_check.launch`, under its lock) for the caller to read
    after its own launch; the third value says whether it was."""
    on_host = dtable.on_host and dlens.on_host
    if on_host:
        block_tables.tables(np.asarray(dtable.obj), np.asarray(dlens.obj), n_blocks, block_size,
                      batch=batch, new_tokens=new_tokens, entries=check)
    table = _ints(dtable, "block_table", stream)
    seqlens = _ints(dlens, "cache_seqlens", stream)
    queued = check and queue and not on_host and batch > 0
    if not on_host:
        block_tables.tables(table, seqlens, n_blocks, block_size, batch=batch,
                      new_tokens=new_tokens, stream=stream, entries=check and not queue)
    if queued:
        _table_check.launch(table, seqlens, n_blocks, block_size, new_tokens, stream)
    return table, seqlens, queued


def paged_attention(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False,
                    window=None, scale=None, return_lse=False, num_splits=None, check=True,
                    softcap=None, alibi_slopes=None, stream=None):
    """Attention of new tokens over a paged KV cache (decoding; Sq > 1 for speculative
    decoding).

    q (B, Hq, Sq, D); k_cache, v_cache (num_blocks, block_size, Hkv, D / Dv); block_table
    (B, max_blocks_per_seq) int32; cache_seqlens (B,) int32 — sequence b's keys are its
    positions 0 … cache_seqlens[b] − 1, kept in blocks block_table[b, 0], [b, 1], ….  The
    Sq queries are the sequence's last Sq positions: ``causal`` and ``window`` follow the
    bottom-right rule of :func:`numba_softmax.attention` with Sk = cache_seqlens[b].  Hq a
    multiple of Hkv (GQA: each K/V head is read once for its group).  The keys are split
    over ``num_splits`` ranges (default: chosen from B·Hkv and the device) merged with
    the (m, ℓ, O) combiner.  Returns O (B, Hq, Sq, Dv) [and LSE (B, Hq, Sq) float32].
    A block id outside the cache or a length beyond the table is a ``ValueError`` (device
    tables: a small kernel checks them just before the attention kernel, which reads
    nothing outside the cache or the table row whatever they hold, and the call waits for
    both).  ``check=False`` skips that check — for a serving loop whose tables are known
    good, so that the call never waits on the device; a bad entry then gives a wrong
    result, not an error.  ``softcap``, ``alibi_slopes`` ((Hq,) or (B, Hq) float32): the
    score modifications of :func:`numba_softmax.attention`, with Sk = cache_seqlens[b].
    """
    stream = ops.as_stream(stream)
    check = checks.flag(check, "check")
    arrays = (q, k_cache, v_cache, block_table, cache_seqlens, None)  # None: no out=
    plan_key, plan, ptrs = None, None, None  # slopes are read on the host each call: no plan
    if alibi_slopes is None:
        plan_key, plan, ptrs = plans.lookup(("paged_attention", causal, window, scale,
                                             return_lse, num_splits, check, softcap), arrays,
                                            stream)
    if plan is not None:  # a repeat call: its layouts were checked when it was recorded
        if not check:
            return plan(arrays, stream, ptrs)
        with _table_check.LOCK:  # the plan queues the tables' check, then the attention
            result = plan(arrays, stream, ptrs)
            found = _table_check.read(stream)  # the tables' contents are new data
        block_tables.refuse_tables(found, block_table.shape, *k_cache.shape[:2])
        return result
    seen = plans.seen(plan_key, ptrs, 5)  # what the look-up read: each array described once
    ds = checks.described_all({"q": q, "k_cache": k_cache, "v_cache": v_cache},
                              checks.ATTENTION_DTYPES, seen[:3])
    dq, dk, dv = ds["q"], ds["k_cache"], ds["v_cache"]
    if not dq.dtype == dk.dtype == dv.dtype:
        raise TypeError("q, k_cache and v_cache must have one dtype")
    dtable = checks.described(block_table, "block_table", seen[3])
    dlens = checks.described(cache_seqlens, "cache_seqlens", seen[4])
    _paged.check_shapes(dq, dk, dv, dtable, dlens)
    causal, return_lse = checks.flag(causal, "causal"), checks.flag(return_lse, "return_lse")
    window, splits = checks.window(window), checks.num_splits(num_splits)
    softcap = checks.softcap(softcap)
    slopes = checks.alibi_slopes(alibi_slopes, tuple(dq.shape[:2]))
    n_blocks, block_size = dk.shape[:2]
    b, hq, sq, d = dq.shape
    d_v = dv.shape[3]
    scale = checks.scale(scale, d)
    kind, dtype = dq.kind, dq.dtype
    described = (dq, dk, dv, dtable, dlens, None)
    with _table_check.LOCK, plans.Recorder(plan_key, arrays, stream, described) as rec:
        o_buf, o4 = heads.output(kind, (b, hq, sq, d_v), dtype, q, 2, stream)
        lse_bufs, lse3 = heads.lse_output(kind, (b, hq, sq), q, return_lse, stream)
        queued = False
        if b and hq and sq:  # the tables: checked, or their check queued before the kernel
            table, seqlens, queued = _tables(dtable, dlens, n_blocks, block_size, b, stream,
                                             check=check, queue=True)
            q4 = heads.view(dq, 2, stream)
            kc, vc = _cache_views([("k_cache", dk), ("v_cache", dv)], stream)
            alibi = None if slopes is None else ops.to_device(slopes, stream)
            _paged.launch(q4, kc, vc, table, seqlens, o4, lse3, causal=causal, window=window,
                          scale=scale, num_splits=splits, stream=stream,
                          small=plans.simulator_enabled(), softcap=softcap, alibi=alibi)
        result = rec.done(heads.Result(kind, dtype), o_buf, *lse_bufs)
        found = _table_check.read(stream) if queued else None
    if found is not None:
        block_tables.refuse_tables(found, dtable.shape, n_blocks, block_size)
    return result


def append_kv(k_new, v_new, k_cache, v_cache, block_table, cache_seqlens, *, check=True,
              stream=None):
    """Write new tokens into a paged cache: k_new, v_new (B, Snew, Hkv, D / Dv) go to
    positions cache_seqlens[b] … cache_seqlens[b] + Snew − 1 of each sequence, in the blocks
    its table row names.  The caches are written in place (they are this function's
    output) and returned; ``cache_seqlens`` is not changed — add Snew to it yourself.
    CUDA arrays only, all four of one kind (a NumPy cache would be a copy, so NumPy new
    tokens are copied to the device by the caller first).  A table that lacks
    the blocks for the new positions is a ``ValueError`` before anything is written.
    ``check=False``: as :func:`paged_attention`'s — device tables are not read on the host
    (no wait on the device); a bad entry then writes a wrong block of the cache, never
    outside it."""
    stream = ops.as_stream(stream)
    check = checks.flag(check, "check")
    names = ("k_new", "v_new", "k_cache", "v_cache")
    ds = checks.described_all(dict(zip(names, (k_new, v_new, k_cache, v_cache))),
                              checks.ATTENTION_DTYPES)
    if ds["k_cache"].on_host:
        raise TypeError("k_cache, v_cache: append_kv writes the caches in place: pass CUDA "
                        "arrays, not NumPy")
    dev = _cache_views([(n, ds[n]) for n in names], stream)
    n_blocks, block_size = ds["k_cache"].shape[:2]
    dtable = checks.described(block_table, "block_table")
    dlens = checks.described(cache_seqlens, "cache_seqlens")
    table, seqlens, _ = _tables(dtable, dlens, n_blocks, block_size, ds["k_new"].shape[0],
                                stream, new_tokens=ds["k_new"].shape[1], check=check)
    _append.launch(*dev, table, seqlens, stream=stream, small=plans.simulator_enabled())
    return k_cache, v_cache
