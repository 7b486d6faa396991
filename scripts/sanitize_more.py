"""More of ``scripts/sanitize.py``'s workload: the chapters after the softmax kernels.

Tensor-core attention (float16 and bfloat16, causal, window, GQA), the wgmma kernels on
sm_90, paged decoding with soft-capping and ALiBi, the backward passes,
fused softmax + top-k and sampling, and the array layer's device copies (negative
strides, strided ``out=``) — each once, on ragged shapes, checked against the float64
references.  Cases whose feature is not there are left out.
"""

import numpy as np

from sanitize import Case


def _torch():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def attention_tc_cases(sim):
    import numba_softmax as ns
    from numba_softmax import reference as R

    torch = _torch()
    if sim or torch is None:
        return []  # the simulator's tensor-core emulation has its own tests (one tile)

    def make(dtype, sq, sk, d, causal, window, hq, hkv):
        def run():
            g = torch.Generator(device="cuda").manual_seed(sq * 100 + sk + d)
            q = torch.randn(2, hq, sq, d, device="cuda", generator=g).to(dtype)
            k = torch.randn(2, hkv, sk, d, device="cuda", generator=g).to(dtype)
            v = torch.randn(2, hkv, sk, d, device="cuda", generator=g).to(dtype)
            o, lse = ns.attention(q, k, v, causal=causal, window=window, return_lse=True)
            ref = R.attention(*(t.float().cpu().numpy() for t in (q, k, v)), causal=causal,
                              window=window or (-1, -1))
            np.testing.assert_allclose(o.float().cpu().numpy(), ref, rtol=2e-2, atol=2e-2)

        return run

    cases = []
    for dtype, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
        for sq, sk, d, causal, window, hq, hkv in [(37, 129, 64, True, None, 4, 2),
                                                    (129, 37, 40, True, None, 2, 2),
                                                    (100, 100, 128, False, (17, 3), 4, 1)]:
            cases.append(Case(f"attention_tc:{name}:{sq}x{sk}:D{d}:{'causal' if causal else 'full'}:"
                              f"w{window}:h{hq}/{hkv}", make(dtype, sq, sk, d, causal, window, hq, hkv)))

    def decode(dtype, sq, sk, d, causal, hq, hkv, page, cap=0.0, alibi=False):
        # split-KV decoding on tensor cores (cap, alibi: the score modifications)
        def run():
            g = torch.Generator(device="cuda").manual_seed(sq * 100 + sk + d)
            q = torch.randn(2, hq, sq, d, device="cuda", generator=g).to(dtype)
            k = torch.randn(2, hkv, sk, d, device="cuda", generator=g).to(dtype)
            v = torch.randn(2, hkv, sk, d, device="cuda", generator=g).to(dtype)
            slopes = (torch.rand(2, hq, device="cuda", generator=g) * 0.5 + 0.05) if alibi else None
            if page:  # the same keys as a shuffled pool of pages (sk a multiple of page)
                per = sk // page
                perm = torch.randperm(2 * per, device="cuda", generator=g)
                pool_k, pool_v = (x.view(2, hkv, per, page, d).permute(0, 2, 3, 1, 4)
                                  .reshape(2 * per, page, hkv, d)[perm.argsort()] for x in (k, v))
                table = perm.view(2, per).to(torch.int32)
                lens = torch.full((2,), sk, device="cuda", dtype=torch.int32)
                o = ns.paged_attention(q, pool_k, pool_v, table, lens, causal=causal,
                                       softcap=cap, alibi_slopes=slopes)
            else:
                o = ns.attention(q, k, v, causal=causal, num_splits=None, softcap=cap,
                                 alibi_slopes=slopes)
            ref = R.attention(*(t.float().cpu().numpy() for t in (q, k, v)), causal=causal,
                              softcap=cap, alibi_slopes=None if slopes is None else slopes.cpu().numpy())
            np.testing.assert_allclose(o.float().cpu().numpy(), ref, rtol=2e-2, atol=2e-2)

        return run

    for dtype, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
        for sq, sk, d, causal, hq, hkv, page in [(1, 1000, 128, False, 8, 2, 0),
                                                 (3, 272, 64, True, 4, 1, 16)]:
            cases.append(Case(f"decode_tc:{name}:{sq}x{sk}:D{d}:{'causal' if causal else 'full'}:"
                              f"h{hq}/{hkv}:page{page}", decode(dtype, sq, sk, d, causal, hq, hkv, page)))
    cases.append(Case("decode_tc:float16:2x512:D128:causal:h8/2:page16:softcap:alibi",
                      decode(torch.float16, 2, 512, 128, True, 8, 2, 16, 30.0, True)))
    return cases


def hopper_cases(sim):
    """The wgmma kernels (``hopper_ws``: every configuration; the backwards hb1 and hb2) on
    an sm_90 GPU: several key tiles through the stage ring and its mbarriers, ragged ends,
    GQA, causal."""
    from numba import cuda

    from numba_softmax import reference as R
    from numba_softmax.kernels.attention import hopper_ws

    torch = _torch()
    if sim or torch is None or torch.cuda.get_device_capability() != (9, 0):
        return []

    def make(config, sq, sk, d, causal, hq, hkv):
        def run():
            g = torch.Generator(device="cuda").manual_seed(sq * 100 + sk + d)
            q = torch.randn(2, hq, sq, d, device="cuda", generator=g).half()
            k = torch.randn(2, hkv, sk, d, device="cuda", generator=g).half()
            v = torch.randn(2, hkv, sk, d, device="cuda", generator=g).half()
            o, lse = torch.empty_like(q), torch.empty(2, hq, sq, device="cuda")
            hopper_ws.launch(*(cuda.as_cuda_array(t) for t in (q, k, v, o, lse)), causal=causal,
                             config=config)
            ref = R.attention(*(t.float().cpu().numpy() for t in (q, k, v)), causal=causal)
            np.testing.assert_allclose(o.float().cpu().numpy(), ref, rtol=2e-2, atol=2e-2)

        return run

    def backward(launch, sq, sk, d, causal, hq, hkv):
        def run():  # hb1 / hb2 against b3, the mma.sync backward, on the same inputs
            from numba_softmax.kernels.backward import attention_backward_tc_launch as b3

            g = torch.Generator(device="cuda").manual_seed(sq * 100 + sk + d + 1)
            q, do = (torch.randn(2, hq, sq, d, device="cuda", generator=g).half() for _ in "qd")
            k, v = (torch.randn(2, hkv, sk, d, device="cuda", generator=g).half() for _ in "kv")
            o, lse = torch.empty_like(q), torch.empty(2, hq, sq, device="cuda")
            nb = [cuda.as_cuda_array(t) for t in (do, q, k, v, o)]
            hopper_ws.launch(*nb[1:], cuda.as_cuda_array(lse), causal=causal)
            grads = [[torch.empty_like(t) for t in (q, k, v)] for _ in range(2)]
            for fn, gs in zip((launch, b3.launch), grads):
                fn(*nb, cuda.as_cuda_array(lse), *(cuda.as_cuda_array(t) for t in gs),
                   causal=causal)
            for x, y in zip(*grads):
                np.testing.assert_allclose(x.float().cpu().numpy(), y.float().cpu().numpy(),
                                           rtol=2e-2, atol=2e-2)

        return run

    from numba_softmax.kernels.backward import hopper_backward, hopper_backward_ws

    shapes = [(129, 300, 64, True, 4, 2), (200, 517, 128, False, 2, 1)]
    return [Case(f"hopper_ws:{c}:float16:{sq}x{sk}:D{d}:{'causal' if causal else 'full'}:h{hq}/{hkv}",
                 make(c, sq, sk, d, causal, hq, hkv))
            for c in hopper_ws.CONFIGS for sq, sk, d, causal, hq, hkv in shapes
            if hopper_ws.takes(c, d, d)] \
        + [Case(f"{name}:float16:{sq}x{sk}:D{d}:{'causal' if causal else 'full'}:h{hq}/{hkv}",
                backward(fn, sq, sk, d, causal, hq, hkv))
           for name, fn in (("hb1", hopper_backward.launch), ("hb2", hopper_backward_ws.launch))
           for sq, sk, d, causal, hq, hkv in shapes]


def backward_cases(sim):
    import numba_softmax as ns
    from numba_softmax import reference as R

    def rows(mode, shape, dtype=np.float32):
        def run():
            rng = np.random.default_rng(shape[1])
            x = rng.standard_normal(shape).astype(dtype)
            dy = rng.standard_normal(shape).astype(dtype)
            y64 = lambda y: y.astype(np.float64)  # noqa: E731
            if mode == "softmax":
                y = ns.softmax(x)
                got, want = ns.softmax_backward(dy, y), R.softmax_backward(dy, y64(y))
            else:
                y = ns.log_softmax(x)
                got, want = ns.log_softmax_backward(dy, y), R.log_softmax_backward(dy, y64(y))
            tol = dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-2, atol=4e-3)
            np.testing.assert_allclose(got.astype(np.float64), want, **tol)

        return run

    def attn(sq, sk, causal, d=40):
        def run():
            rng = np.random.default_rng(sq + sk)
            q, k, v = (rng.standard_normal((2, s, d)).astype(np.float32) for s in (sq, sk, sk))
            o, lse = ns.attention(q, k, v, causal=causal, return_lse=True)
            do = rng.standard_normal(o.shape).astype(np.float32)
            got = ns.attention_backward(do, q, k, v, o, lse, causal=causal)
            want = R.attention_backward(do, q, k, v, o, lse, causal=causal)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)

        return run

    def attn_tc(dtype, sq, sk, d, causal, hq, hkv):  # fp16 / bf16: the tensor-core kernel
        def run():
            torch = _torch()
            g = torch.Generator(device="cuda").manual_seed(sq * 100 + sk + d)
            q, do = (torch.randn(1, hq, sq, d, device="cuda", generator=g).to(dtype) for _ in "qo")
            k, v = (torch.randn(1, hkv, sk, d, device="cuda", generator=g).to(dtype) for _ in "kv")
            o, lse = ns.attention(q, k, v, causal=causal, return_lse=True)
            got = ns.attention_backward(do, q, k, v, o, lse, causal=causal)
            host = [t.float().cpu().numpy().astype(np.float64) for t in (do, q, k, v, o, lse)]
            want = R.attention_backward(*host, causal=causal)
            tol = 2e-2 if dtype == torch.float16 else 8e-2
            for a, w in zip(got, want):
                err = np.max(np.abs(a.float().cpu().numpy() - w))
                assert err <= tol * max(1.0, np.max(np.abs(w))), f"error {err}"

        return run

    shapes = [(3, 37), (2, 300)] if sim else [(3, 37), (5, 1001), (2, 70000)]
    cases = [Case(f"backward:{m}:{s[0]}x{s[1]}", rows(m, s)) for m in ("softmax", "log_softmax")
             for s in shapes]
    if not sim:  # sm_90: a cluster of 5 (float32) or 3 blocks a row (50 rows fill the
        # device); float16 held two to a register (:mod:`numba_softmax.kernels.rows.pairs`) in a
        # cluster and in a block (rows of whole 16-byte vectors: 20000, 9000 — the record of
        # 0469cba ran 20011, whose rows take no vectors and so no pairs)
        cases += [Case(f"backward:{m}:50x{n}:{np.dtype(d).name}", rows(m, (50, n), d))
                  for m in ("softmax", "log_softmax")
                  for n, d in ((20000, np.float32), (20000, np.float16), (9000, np.float16))]
    for sq, sk in ([(9, 20)] if sim else [(37, 129), (129, 37)]):
        for causal in (False, True):
            cases.append(Case(f"attention_backward:{sq}x{sk}:{'causal' if causal else 'full'}",
                              attn(sq, sk, causal)))
    if not sim:  # D 128: 16-byte column vectors, dQ by red.global.add.v4 (sm_90)
        cases.append(Case("attention_backward:70x70:D128:causal", attn(70, 70, True, 128)))
    torch = None if sim else _torch()
    if torch is not None:  # (the simulator's tensor-core emulation has its own tests)
        for dtype, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
            for sq, sk, d, causal, hq, hkv in [(37, 129, 40, True, 4, 2), (129, 37, 20, False, 2, 2),
                                               (70, 70, 128, True, 2, 1)]:
                cases.append(Case(f"attention_backward_tc:{name}:{sq}x{sk}:D{d}:"
                                  f"{'causal' if causal else 'full'}:h{hq}/{hkv}",
                                  attn_tc(dtype, sq, sk, d, causal, hq, hkv)))
    return cases


def topk_cases(sim):
    import numba_softmax as ns
    from numba_softmax.reference import topk as RT

    def make(shape, k):
        def run():
            rng = np.random.default_rng(shape[1] + k)
            x = (3 * rng.standard_normal(shape)).astype(np.float32)
            x[0, :3] = -np.inf
            values, indices = ns.softmax_topk(x, k)
            want_v, want_i = RT.softmax_topk(x.astype(np.float64), k)
            np.testing.assert_allclose(values, want_v, rtol=1e-4, atol=1e-6)
            tokens = ns.sample(x, top_k=min(k, 8), top_p=0.9, seed=3)
            assert tokens.shape == (shape[0],) and (tokens >= 0).all() and (tokens < shape[1]).all()

        return run

    shapes = [((3, 37), 5), ((2, 300), 8)] if sim else [((3, 37), 5), ((5, 1001), 50),
                                                        ((1, 128256), 8), ((64, 32000), 50),
                                                        ((300, 5000), 8), ((300, 5000), 40)]
    # (GPU: a warp per row with the buffer; the radix split; the lists split with the
    # buffer and the block's floor; a block per row inserting in turn, and buffering)
    return [Case(f"topk:{s[0]}x{s[1]}:k{k}", make(s, k)) for s, k in shapes]


def view_cases(sim):
    """The array layer's device copies: negative strides in, a scrambled out= filled."""
    from numba import cuda

    import numba_softmax as ns
    from numba_softmax import reference as R

    def run():
        rng = np.random.default_rng(5)
        host = rng.standard_normal((6, 9, 33)).astype(np.float32)
        d = cuda.to_device(host)
        got = ns.softmax(d[::-1, :, ::-2], axis=1).copy_to_host()
        want = np.moveaxis(R.softmax(np.moveaxis(host[::-1, :, ::-2].astype(np.float64), 1, -1)), -1, 1)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        base = cuda.to_device(np.full((33, 6, 9), np.nan, np.float32))
        from numba_softmax.arrays import kinds

        b = kinds.describe(base)
        out = kinds.view_of(b, (6, 9, 33), (b.strides[1], b.strides[2], b.strides[0]))
        ns.log_softmax(d, out=out)
        np.testing.assert_allclose(out.copy_to_host(), np.log(R.softmax(host.astype(np.float64))),
                                   rtol=1e-5, atol=1e-5)

    return [Case("views:negative-strides:scrambled-out", run)]


def more_cases(sim):
    out = []
    for build in (attention_tc_cases, hopper_cases, backward_cases, topk_cases, view_cases):
        try:
            out += build(sim)
        except ImportError:
            pass  # that chapter is not there
    return out
