"""Attention: the forward pass against SDPA, and decoding against SDPA's dense GQA decode.

**attention** — ``numba_softmax.attention`` (it dispatches by dtype: float32 on CUDA
cores, float16/bfloat16 on tensor cores where that kernel exists) against PyTorch's
``scaled_dot_product_attention`` in the *same* dtype, causal off and on, D = 64 and 128,
(B, H) = (16384 / S, 8): the same tokens for every S, (4, 8) at S = 4096 as the attention targets'
table.  4·B·H·S²·D flops (halved causal), TFLOP/s, % of the device's peak, × SDPA.  Where
Triton imports, the fp16/bf16 rows also time the Triton peer
(:mod:`.triton_attention`: FlashAttention-2 as Triton's tutorial writes it), checked
against SDPA first like ours.

**decode** — one new token (Sq = 1) per sequence against a KV cache of ``ctx`` tokens,
grouped-query heads Hq = 32, Hkv = 8, D = 128 (the decode targets' shapes): ours split-KV (``num_splits``
for about two blocks per SM) and, where ``numba_softmax.paged_attention`` exists, over a
paged cache (shuffled block table, page sizes 16 and 256); against SDPA decoding the
dense cache with ``enable_gqa=True`` (K/V never expanded).  GB/s of cache read
(2·B·Hkv·ctx·D·b bytes), held to the read-only stream: decoding reads, it hardly writes.
"""

import numpy as np
from numba import cuda

from .context import ITEMSIZE, Skip, WrongResult, feature
from .results import attention_bytes, attention_flops

CALL_LEVEL_MAX_MS = 10.0  # full mode: whole-call rows only where overhead can matter
CHECK_ATOL = 0.05  # |O − O_sdpa| on values in [−1, 1): catches garbage, not rounding
DECODE_QUICK = ((1, 4096), (1, 131072), (16, 32768), (64, 4096))


def _api():
    return feature("numba_softmax.attention:attention")


def pow2_at_least(n):
    p = 1
    while p < n:
        p *= 2
    return p


def decode_splits(batch_heads, num_sms, sk):
    """Splits for split-KV decoding: enough blocks for two per multiprocessor (a power
    of two), but no split shorter than 64 keys; at least 2."""
    return max(2, min(pow2_at_least(-(-2 * num_sms // batch_heads)), sk // 64))


def _qkvo(b, dtype, kind, q_shape, kv_shape, k_sets, seed=0):
    sets = []
    for s in range(k_sets):
        arrays = (b.random(q_shape, dtype, 4 * s + seed, -1.0, 2.0),
                  b.random(kv_shape, dtype, 4 * s + seed + 1, -1.0, 2.0),
                  b.random(kv_shape, dtype, 4 * s + seed + 2, -1.0, 2.0),
                  b.random(q_shape, dtype, 4 * s + seed + 3, -1.0, 2.0))
        sets.append(tuple(b.view(a, kind) for a in arrays))
    return sets


def _sdpa(b):
    return None if b.torch is None else b.torch.nn.functional.scaled_dot_product_attention


def _check(b, got, want, what):
    """Ours against SDPA on the first set (loosely: a wrong kernel is not timed)."""
    b.timer.sync()
    err = float((got.float() - want.float()).abs().max())
    if not err <= CHECK_ATOL:
        raise WrongResult(f"{what}: max |O − O_sdpa| = {err:.3g} (> {CHECK_ATOL}); not timed")


# --- forward ---------------------------------------------------------------------------------
def forward_cases(b):
    cfg = b.cfg
    dtypes = b.dtypes(cfg.pick(("float32",), ("float32", "float16", "bfloat16"),
                               ("float32", "float16", "bfloat16")))
    seqs = cfg.pick((16,), (4096,), (1024, 4096, 16384))
    dims = cfg.pick((16,), (64, 128), (64, 128))
    causals = cfg.pick((True,), (False, True), (False, True))
    tokens, heads = cfg.pick(16, 16384, 16384), cfg.pick(1, 8, 8)
    return [(dt, d, s, c, max(1, tokens // s), heads)
            for dt in dtypes for d in dims for s in seqs for c in causals]


def run_forward(b):
    attention = _api()
    for dtype, d, s, causal, batch, heads in forward_cases(b):
        b.case(f"attention {dtype} D{d} S{s} causal={causal}",
               lambda: forward(b, attention, dtype, d, s, causal, batch, heads))


def forward(b, attention, dtype, d, s, causal, batch, heads):
    item = ITEMSIZE[dtype]
    shape = (batch, heads, s, d)
    k_sets = b.n_sets(attention_bytes(batch, heads, s, s, d, item))
    kind = b.user_kind(dtype)
    sets = _qkvo(b, dtype, kind, shape, shape, k_sets)
    row = dict(suite="attention", dtype=dtype, B=batch, H=heads, Sq=s, Sk=s, D=d, causal=causal,
               bytes=attention_bytes(batch, heads, s, s, d, item),
               flops=attention_flops(batch, heads, s, s, d, causal))
    stream = b.call_stream

    def ours(i):
        q, k, v, o = sets[i]
        attention(q, k, v, causal=causal, out=o, stream=stream)

    sdpa = _sdpa(b)
    if sdpa is not None:
        q, k, v, o = sets[0]
        o.fill_(float("nan"))  # poisoned: an output the kernel forgot cannot pass
        b.timer.sync()
        ours(0)
        _check(b, o, sdpa(q, k, v, is_causal=causal), f"attention {dtype} D{d} S{s}")
    timing = b.timer.device(ours, k_sets)
    b.record(timing, impl="numba_softmax", level="kernel", array=kind, **row)
    if b.cfg.smoke or (b.cfg.mode == "full" and timing["median_ms"] < CALL_LEVEL_MAX_MS):
        def call(i):
            q, k, v, _ = sets[i]
            attention(q, k, v, causal=causal)

        b.record(b.timer.host(call, k_sets), impl="numba_softmax", level="call", array=kind, **row)
    if sdpa is not None:
        def peer(i):
            with b.on_stream("torch"):
                sdpa(*sets[i][:3], is_causal=causal)

        b.record(b.timer.device(peer, k_sets), impl="torch.sdpa", level="kernel", array="torch",
                 **row)
        _triton_row(b, sets, k_sets, dtype, d, s, causal, sdpa, row)


def _triton_row(b, sets, k_sets, dtype, d, s, causal, sdpa, row):
    """The Triton peer's row (fp16/bf16, D 64/128, S a multiple of 128), if Triton imports."""
    if dtype == "float32" or d not in (64, 128) or s % 128:
        return
    try:
        from . import triton_attention
    except Exception:  # noqa: BLE001 - no Triton (or a broken one): no Triton row
        return

    def peer(i):
        q, k, v, _ = sets[i]
        with b.on_stream("torch"):
            triton_attention.attention(q, k, v, causal)

    q, k, v, _ = sets[0]
    with b.on_stream("torch"):
        got = triton_attention.attention(q, k, v, causal)  # (also the autotuner's sweep)
    _check(b, got, sdpa(q, k, v, is_causal=causal), f"triton attention {dtype} D{d} S{s}")
    b.record(b.timer.device(peer, k_sets), impl="triton", level="kernel", array="torch", **row)


# --- decode ----------------------------------------------------------------------------------
def decode_cases(b):
    cfg = b.cfg
    dtypes = b.dtypes(cfg.pick(("float32",), ("float16",), ("float16", "bfloat16")))
    grid = cfg.pick(((1, 64),), DECODE_QUICK,
                    tuple((bb, c) for bb in (1, 16, 64) for c in (4096, 32768, 131072)))
    heads = cfg.pick((2, 1, 16), (32, 8, 128), (32, 8, 128))
    return [(dt, bb, c) + heads for dt in dtypes for bb, c in grid]


def run_decode(b):
    attention = _api()
    try:
        paged = feature("numba_softmax:paged_attention",
                        "numba_softmax.paged_attention:paged_attention")
    except Skip as e:
        paged = None
        b.skip("decode, paged", str(e))
    pages = b.cfg.pick((16,), (256,), (16, 256))
    for dtype, batch, ctx, hq, hkv, d in decode_cases(b):
        label = f"decode {dtype} B{batch} ctx{ctx}"
        b.case(label, lambda: dense(b, attention, dtype, batch, ctx, hq, hkv, d))
        for page in pages if paged is not None else ():
            b.case(f"{label} paged {page}",
                   lambda: paged_case(b, paged, dtype, batch, ctx, hq, hkv, d, page))


def _decode_row(dtype, batch, ctx, hq, hkv, d):
    cache = 2 * batch * hkv * ctx * d * ITEMSIZE[dtype]
    return dict(suite="decode", dtype=dtype, B=batch, H=hq, Hkv=hkv, Sq=1, Sk=ctx, D=d,
                causal=False, bytes=cache, bound="read")


def gqa_works(b, attention):
    """Whether this checkout's split-KV kernel reads grouped K/V heads correctly, probed
    once on a tiny problem against the float64 reference.  K and V are the first head of
    two-head device arrays, so a kernel without GQA reads the second head — wrong values,
    caught here — rather than memory past an allocation."""
    if "gqa" not in b.memo:
        from .. import reference

        rng = np.random.default_rng(0)
        q = rng.standard_normal((1, 2, 1, 16)).astype(np.float32)
        k2, v2 = (rng.standard_normal((1, 2, 64, 16)).astype(np.float32) for _ in range(2))
        want = reference.attention(q, k2[:, :1], v2[:, :1])
        try:
            k, v = (cuda.to_device(a)[:, :1] for a in (k2, v2))
            got = attention(cuda.to_device(q), k, v, num_splits=2).copy_to_host()
            b.memo["gqa"] = bool(np.abs(got - want).max() < 1e-4)
        except Exception:  # noqa: BLE001 - refused or failed: no GQA here
            b.memo["gqa"] = False
    return b.memo["gqa"]


def _expand(b, x, rep, kind):
    """K or V with each head repeated ``rep`` times (axis 1), for a kernel without GQA."""
    if kind == "torch":
        return x.repeat_interleave(rep, 1)
    if kind == "cupy":
        return b.cupy.repeat(x, rep, axis=1)
    return cuda.to_device(np.repeat(x.copy_to_host(), rep, axis=1))


def dense(b, attention, dtype, batch, ctx, hq, hkv, d):
    row = _decode_row(dtype, batch, ctx, hq, hkv, d)
    k_sets = b.n_sets(row["bytes"])
    kind = b.user_kind(dtype)
    sets = _qkvo(b, dtype, kind, (batch, hq, 1, d), (batch, hkv, ctx, d), k_sets)
    splits = decode_splits(batch * hq, b.limits.sms, ctx)
    stream = b.call_stream
    mine, ours_note = sets, ""
    if hq != hkv and not gqa_works(b, attention):
        mine = [(q, _expand(b, k, hq // hkv, kind), _expand(b, v, hq // hkv, kind), o)
                for q, k, v, o in sets]
        ours_note = "K/V expanded to Hq heads (this checkout's kernel has no GQA)"

    def ours(i):
        q, k, v, o = mine[i]
        attention(q, k, v, num_splits=splits, out=o, stream=stream)

    sdpa, note = _sdpa(b), ""
    if sdpa is not None:
        gqa = {"enable_gqa": True}
        try:
            want = sdpa(*sets[0][:3], **gqa)
        except TypeError:  # torch < 2.5: no GQA in SDPA — expand K/V (and say so)
            gqa, note = {}, "K/V expanded to Hq heads (SDPA without enable_gqa)"
            want = None

        def peer_call(i):
            q, k, v, _ = sets[i]
            if not gqa:
                k, v = (t.repeat_interleave(hq // hkv, 1) for t in (k, v))
            return sdpa(q, k, v, **gqa)

        sets[0][3].fill_(float("nan"))  # poisoned: an output the kernel forgot cannot pass
        b.timer.sync()
        ours(0)
        _check(b, sets[0][3], peer_call(0) if want is None else want,
               f"decode {dtype} B{batch} ctx{ctx}")
    b.record(b.timer.device(ours, k_sets), impl="split-KV", level="kernel", array=kind,
             splits=splits, note=ours_note, **row)
    if sdpa is not None:
        def peer(i):
            with b.on_stream("torch"):
                peer_call(i)

        b.record(b.timer.device(peer, k_sets), impl="torch.sdpa", level="kernel",
                 array="torch", note=note, **row)


def paged_case(b, paged, dtype, batch, ctx, hq, hkv, d, page):
    row = _decode_row(dtype, batch, ctx, hq, hkv, d)
    k_sets = b.n_sets(row["bytes"])
    kind = b.user_kind(dtype)
    per_seq = -(-ctx // page)
    blocks = batch * per_seq
    rng = np.random.default_rng(page)
    sets = []
    for s, (q, kc, vc, o) in enumerate(_qkvo(b, dtype, kind, (batch, hq, 1, d),
                                             (blocks, page, hkv, d), k_sets, seed=50)):
        table = rng.permutation(blocks).astype(np.int32).reshape(batch, per_seq)
        lens = np.full(batch, ctx, dtype=np.int32)
        sets.append((q, kc, vc, b.view(cuda.to_device(table), kind),
                     b.view(cuda.to_device(lens), kind)))
    stream = b.call_stream

    def ours(i):  # the kernel: the table check (a launch and a wait) is in the overhead rows
        paged(*sets[i], stream=stream, check=False)

    b.record(b.timer.device(ours, k_sets), impl="paged", level="kernel", array=kind, page=page,
             **row)
